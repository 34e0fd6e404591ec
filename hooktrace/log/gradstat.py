"""A gradient's statistics as a log holds them (``GradStat``), and the one norm of a call's
gradients that every reader computes from them. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

#: one gradient tensor's statistics, as in the events and the ``ops`` records: [norm, absmax]
#: and, when the norm is not finite, [norm, absmax, nan_count, inf_count]; None (in the lists
#: that hold them) where no gradient flowed
GradStat = list[float]


def norms(stats: Sequence[Sequence[float] | None] | None) -> list[float]:
    """Each tensor's gradient norm, the tensors that got no gradient (None) left out."""
    return [s[0] for s in stats or () if s is not None]


def norm(stats: Sequence[Sequence[float] | None] | None) -> float | None:
    """The L2 norm of all the tensors' gradients together (NaN/Inf when one is not finite);
    None where no tensor has statistics: a call's gradient norm, as the reports show it."""
    found = norms(stats)
    return math.sqrt(sum(n * n for n in found)) if found else None


def worst(values: Iterable[float]) -> float | None:
    """The first value that is not finite, else the largest; None for no value: a gradient
    that went NaN/Inf once says more than any size."""
    found = list(values)
    return next((n for n in found if not math.isfinite(n)), max(found, default=None))

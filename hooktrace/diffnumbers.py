"""The numbers of two matched calls side by side: when they agree within a tolerance, where
NaN/Inf appear in one run only, and how a divergence grows over the modules and steps after it.
Standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hooktrace.align import Event

Found = tuple[str, str, str, str, float | None]  # kind, what, A's value, B's, relative difference
_STATS = ("norm", "absmax")
_PROFILE_IN_STEP = 5  # modules shown for the step where the numbers first part
_PROFILE_STEPS = 4  # later steps shown (and the last one)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def close(self, x: float, y: float) -> bool:
        """Within tolerance; NaN agrees with NaN and an infinity with itself."""
        if math.isfinite(x) and math.isfinite(y):
            return abs(x - y) <= self.atol + self.rtol * max(abs(x), abs(y))
        return (math.isnan(x) and math.isnan(y)) or x == y


def relative(x: float, y: float) -> float:
    scale = max(abs(x), abs(y))
    return abs(x - y) / scale if scale else 0.0


def _stat_text(stat: Sequence[float]) -> str:
    if len(stat) == 4 or not math.isfinite(stat[0]):
        nan, inf = (int(stat[2]), int(stat[3])) if len(stat) == 4 else (0, 0)
        return f"{nan} NaN, {inf} Inf"
    return f"norm {stat[0]:.4g}, absmax {stat[1]:.4g}"


class Numbers:
    """Compares the statistics of two matched calls."""

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance

    def compare(self, a: Event, b: Event) -> Found | None:
        """The worst difference between the calls' numbers: NaN/Inf in one only first, then
        the largest relative difference past the tolerance; None when they agree."""
        if a.phase == "forward":
            return _outputs(a.nonfinite, b.nonfinite)
        worst: Found | None = None
        for label, stats_a, stats_b in (("grad_output", a.out_stats, b.out_stats),
                                        ("grad_input", a.in_stats, b.in_stats)):
            if stats_a is None or stats_b is None or stats_a == stats_b:
                continue
            for i, (x, y) in enumerate(zip(stats_a, stats_b, strict=False)):
                if x is None or y is None:  # a gradient in one run only: a shapes difference
                    continue
                found = self._gradient(f"{label} {i}", x, y)
                if found is not None and (worst is None or found[4] is None or (
                        worst[4] is not None and found[4] > worst[4])):
                    worst = found
                if worst is not None and worst[4] is None:
                    return worst
        return worst

    def _gradient(self, label: str, x: Sequence[float], y: Sequence[float]) -> Found | None:
        if math.isfinite(x[0]) != math.isfinite(y[0]):
            run = "B" if math.isfinite(x[0]) else "A"
            return ("nonfinite", f"{label} has NaN/Inf in {run} only", _stat_text(x),
                    _stat_text(y), None)
        worst: Found | None = None
        for j, stat in enumerate(_STATS):
            if not self.tolerance.close(x[j], y[j]):
                rel = relative(x[j], y[j])
                if worst is None or (worst[4] is not None and rel > worst[4]):
                    worst = ("value", f"{label} {stat} differs by {rel:.2g} (relative)",
                             f"{x[j]:.4g}", f"{y[j]:.4g}", rel)
        return worst


def _outputs(a: Sequence[Sequence[int]] | None, b: Sequence[Sequence[int]] | None
             ) -> Found | None:
    """Forward outputs with NaN/Inf in one run only."""
    in_a = {int(o[0]): o for o in a or ()}
    in_b = {int(o[0]): o for o in b or ()}
    odd = sorted(in_a.keys() ^ in_b.keys())
    if not odd:
        return None
    i = odd[0]
    run = "A" if i in in_a else "B"

    def text(found: dict[int, Sequence[int]]) -> str:
        return f"{found[i][1]} NaN, {found[i][2]} Inf" if i in found else "finite"

    return ("nonfinite", f"output {i} has NaN/Inf in {run} only", text(in_a), text(in_b), None)


def param_differences(a: dict[str, float | None], b: dict[str, float | None],
                      tolerance: Tolerance) -> list[tuple[str, float | None, float | None]]:
    """(fqn, A's norm, B's norm) where they differ; None: no gradient reached its parameters."""
    out: list[tuple[str, float | None, float | None]] = []
    for name in [*a, *(k for k in b if k not in a)]:
        x, y = a.get(name), b.get(name)
        if (x is None) != (y is None) or (
                x is not None and y is not None and not tolerance.close(x, y)):
            out.append((name, x, y))
    return out


@dataclass
class Growth:
    """How a divergence grows: the differing calls of the step where it starts, then the
    largest relative difference of each later step."""

    first: list[dict[str, Any]] = field(default_factory=list)
    later: list[dict[str, Any]] = field(default_factory=list)
    _start: int | None = None
    _worst: dict[str, Any] | None = None  # the current later step's largest difference

    def add(self, step: int, event: Event, rel: float | None) -> None:
        """A call whose numbers differ (``rel`` None: NaN/Inf in one run only)."""
        entry = {"step": step, "module": event.name, "phase": event.phase, "relative": rel}
        if self._start is None:
            self._start = step
        if step == self._start:
            self.first.append(entry)
        elif self._worst is None or _larger(rel, self._worst["relative"]):
            self._worst = entry

    def agree(self, step: int) -> None:
        self.step_done(step)

    def step_done(self, step: int) -> None:
        if self._start is None or step == self._start:
            return
        entry = self._worst or {"step": step, "module": None, "phase": None, "relative": 0.0}
        self._worst = None
        if len(self.later) > _PROFILE_STEPS:  # keep the first few and the last
            self.later[-1] = entry
        else:
            self.later.append(entry)

    def profile(self) -> list[dict[str, Any]]:
        first = self.first
        if len(first) > _PROFILE_IN_STEP:
            stride = (len(first) - 1) / (_PROFILE_IN_STEP - 1)
            first = [first[round(i * stride)] for i in range(_PROFILE_IN_STEP)]
        return [*first, *self.later]


def _larger(rel: float | None, than: float | None) -> bool:
    if than is None:
        return False
    return rel is None or rel > than

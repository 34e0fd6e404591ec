"""Whether a module's own weights hold NaN/Inf, asked only of a call whose output does (a rare
path, nothing per healthy call): what tells a forward that made NaN/Inf from weights that an
optimizer step had already made so (float16 weights with Adam's ``eps=1e-8``, which rounds to
0, or an update that overflowed)."""

from __future__ import annotations

import torch
from torch import nn


def nonfinite_params(module: nn.Module | None) -> dict[str, str]:
    """``module``'s own parameters holding NaN/Inf, name -> dtype (``float16``)."""
    if module is None:
        return {}
    params = [(name, p) for name, p in module._parameters.items()
              if p is not None and (p.is_floating_point() or p.is_complex()) and not p.is_meta]
    if not params:
        return {}
    # one read for all of them (on a device, one transfer)
    finite = torch.stack([torch.isfinite(p.detach()).all() for _, p in params]).tolist()
    return {name: str(p.dtype).removeprefix("torch.")
            for (name, p), ok in zip(params, finite, strict=True) if not ok}

"""NaN/Inf in forward outputs, each tensor checked once while it stays unchanged."""

from __future__ import annotations

import weakref

import torch

from hooktrace.stats import Stats


class OutputCheck:
    """Which outputs of a call hold NaN/Inf; a tensor just checked (a parent returning its last
    child's output) is not checked twice."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._last: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def check(self, outputs: list[torch.Tensor]) -> list[list[int]]:
        """[output index, nan, inf] per non-finite output; on a device, filled in when the
        statistics are resolved."""
        found: list[list[int]] = []
        last = self._last
        checked = []
        for i, t in enumerate(outputs):
            try:
                version = t._version
            except RuntimeError:  # an inference-mode tensor has no version counter
                version = -1
            for ref, v in last:  # a loop, not any(): no generator per output
                if ref() is t and v == version:
                    break
            else:
                self._stats.nonfinite(t, found, i)
            checked.append((weakref.ref(t), version))
        self._last = checked
        return found

    def reset(self) -> None:
        """A step ended: forget the last outputs."""
        self._last = []

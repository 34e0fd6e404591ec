"""NaN/Inf in forward outputs, each tensor checked once while it stays unchanged."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hooktrace.observe.stats import TensorStats


class OutputCheck:
    """Which outputs of a call hold NaN/Inf; a tensor just checked (a parent returning its last
    child's output) is not checked twice."""

    def __init__(self, stats: TensorStats) -> None:
        self._stats = stats
        self._last: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def check(self, outputs: list[torch.Tensor]) -> list[list[int]]:
        """[output index, nan, inf] per NaN/Inf output; on a device, filled in when the
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



#: a call, as the caller names it (any immutable object)
Who = Any
#: the NaN/Inf outputs of one call: [output index, nan count, inf count] each
NonFinite = list[list[int]]


class _Group:
    """The calls since the last model call returned, up to and with that model call."""

    __slots__ = ("held", "checked", "top")

    def __init__(self) -> None:
        # held outputs in call order: (tensor, the call's number, who, output index)
        self.held: list[tuple[torch.Tensor, int, Who, int]] = []
        # (the call's number, who, found) of the calls with outputs checked at once (past the
        # bytes held; not plain tensors); once settled, of every call found with NaN/Inf
        self.checked: list[tuple[int, Who, NonFinite]] = []
        self.top: NonFinite = []  # the model call's own NaN/Inf outputs


class HeldOutputs:
    """A watched step's NaN/Inf check of forward outputs at the cost of one check per model call.

    Each traced call's outputs are held, not reduced. When a model call (a top-level one)
    returns, its outputs are checked; NaN/Inf propagate, so only when they are not finite are
    the held outputs checked one by one, in call order, to name the first call that produced
    them. Past ``hold_bytes`` an output is checked at once instead of held (big activations,
    where a reduction costs little next to the model's own work), so that no more than that is
    kept alive. On a device the model call's check is deferred (``TensorStats``): its group waits
    for the step's numbers.

    Not seen: a NaN/Inf that does not reach the model's output (a masked or dropped branch), or
    that an in-place op overwrote before the model call returned: a held output is judged as it
    is then (an in-place activation keeps NaN a NaN, and names the call that made the tensor)."""

    def __init__(self, stats: TensorStats, hold_bytes: int) -> None:
        self._stats = stats
        self._hold_bytes = hold_bytes
        self._bytes = 0
        self._group = _Group()
        self._returned: list[_Group] = []  # model calls returned, waiting for the step's numbers
        self._calls = 0  # calls added: each call's number, their order

    @property
    def waiting(self) -> int:
        """Model calls whose check waits for the step's numbers (on a device)."""
        return len(self._returned)

    def add(self, outputs: list[torch.Tensor], who: Who, top: bool) -> None:
        """A traced call returned ``outputs``; ``top``: it is a model call."""
        group = self._group
        held = group.held
        n = self._calls = self._calls + 1
        found: NonFinite | None = None
        for i, t in enumerate(outputs):
            if type(t) is not torch.Tensor:
                size = self._hold_bytes + 1  # a subclass (a DTensor): as TensorStats sees it
            elif held and held[-1][0] is t:
                continue  # a parent returning its last child's output (or an in-place one's)
            elif not t.is_floating_point() or t.is_meta:
                continue
            else:
                size = t.nbytes
            if self._bytes + size <= self._hold_bytes:
                self._bytes += size
                held.append((t, n, who, i))
            else:
                if found is None:
                    found = []
                    group.checked.append((n, who, found))
                self._stats.nonfinite(t, found, i)
        if top:
            for i, t in enumerate(outputs):
                self._stats.nonfinite(t, group.top, i)
            self._group = _Group()
            if self._stats.deferred:
                self._returned.append(group)
            else:
                self._bytes = 0
                if self._settle(group):
                    self._returned.append(group)

    def take(self) -> list[tuple[Who, NonFinite]]:
        """The calls whose outputs held NaN/Inf, in call order. Call when the step's numbers
        are resolved; the outputs of a model call that has not returned stay held."""
        calls: list[tuple[int, Who, NonFinite]] = []
        for group in self._returned:
            self._settle(group)
            calls += group.checked
        calls.sort(key=lambda call: call[0])
        self._returned = []
        self._bytes = sum(t.nbytes for t, *_ in self._group.held)
        return [(who, found) for _, who, found in calls]

    def reset(self) -> None:
        """Tracing stopped: hold nothing more."""
        self._group, self._returned, self._bytes = _Group(), [], 0

    def _settle(self, group: _Group) -> bool:
        """Check the group's held outputs (only when its model call's were not finite) and
        release them; leave in ``checked`` only the calls found with NaN/Inf. Whether any was."""
        if group.top:
            per_call: dict[int, tuple[int, Who, NonFinite]] = {}
            for t, n, who, i in group.held:
                if not torch.isfinite(t).all():
                    per_call.setdefault(n, (n, who, []))[2].append(
                        [i, int(torch.isnan(t).sum()), int(torch.isinf(t).sum())])
            group.checked += per_call.values()
        group.held = []
        group.checked = [call for call in group.checked if call[2]]
        return bool(group.checked)

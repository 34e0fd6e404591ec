"""Statistics on an accelerator: reductions left on the device, read in one transfer per step.

Each tensor costs one or two reductions (a norm and an absolute max per gradient, an L1 norm per
forward output, a count of non-zero elements where ``gradzeros`` asks for one), written with
``out=`` into slots of one float32 buffer per device (``_Values``); ``resolve()`` brings a step's
numbers to the host in one transfer per device. NaN/Inf in a tensor kept until then
(``hold_bytes``) are counted after that transfer, in a second one that only a step with NaN/Inf
pays; past the budget, they are counted at once, into two more slots. A deferred number allocates
no Python object that outlives its hook but the list of events it fills: objects that live for a
step make Python's full garbage collections (0.1-0.3 s each with torch loaded) frequent. So pending
numbers wait flat in one list, six items an entry, not as a record each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

_Fill = Callable[[list[float]], None]
#: what a deferred gradient's numbers fill: [target, index, target, index, ...]
Targets = list[Any]
#: What a watched step's finite gradient gets instead of its numbers (no event is written)
FINITE: tuple[float, ...] = (0.0, 0.0)
# the kinds of deferred numbers, and what each fills (``who``): a gradient's norm and absmax
# (targets), a watched gradient's one sum (targets), an output's one sum (its call's NaN/Inf
# outputs), a count of non-zero elements (a list, at ``index``), ``index`` parameter norms (a
# function of their values)
_GRAD, _CHECK, _OUTPUT, _NONZERO, _PARAMS = range(5)


class _Values:
    """Where a device's reductions of one step land: slots of one float32 buffer, written with
    ``out=`` (no tensor object per number, nothing for Python's garbage collector to follow),
    read with one transfer when the step ends. The buffer and its slots are kept from step to
    step."""

    __slots__ = ("buffer", "slots", "used", "read")

    def __init__(self, device: torch.device) -> None:
        self.buffer = torch.empty(0, dtype=torch.float32, device=device)
        self.slots: list[torch.Tensor] = []  # 0-d views of the buffer, made once
        self.used = 0
        self.read: list[float] = []  # the values, once resolve has read them

    def take(self, n: int) -> int:
        """The first of ``n`` free slots."""
        pos = self.used
        if pos + n > len(self.slots):
            size = max(1024, 2 * (pos + n))
            buffer = torch.empty(size, dtype=torch.float32, device=self.buffer.device)
            buffer[:pos].copy_(self.buffer[:pos])
            self.buffer, self.slots = buffer, list(buffer.unbind())
        self.used = pos + n
        return pos


class DeviceStats:
    """The accelerator's implementation of ``stats.TensorStats``'s reductions."""

    def __init__(self, hold_bytes: int) -> None:
        self._hold_bytes = hold_bytes
        self._values: dict[torch.device, _Values] = {}
        # the step's deferred numbers: (kind, _Values, first slot, who, index, the tensor kept
        # for a second transfer or None: its NaN/Inf counts follow the first slots), flat
        self._queue: list[Any] = []
        self._held_bytes = 0
        self._follow_ups: list[tuple[list[torch.Tensor], _Fill]] = []  # the second transfer
        self.transfers = 0  # device-to-host transfers made by resolve (for the tests)

    @property
    def deferred(self) -> bool:
        return bool(self._queue)

    def _slots_of(self, t: torch.Tensor) -> _Values:
        values = self._values.get(t.device)
        if values is None:
            values = self._values[t.device] = _Values(t.device)
        return values

    def reduce(self, grad: torch.Tensor, full: bool) -> Targets:
        """Defer a gradient's norm and absmax (else one sum that says whether it is finite);
        return the targets they will fill."""
        targets: Targets = []
        self._defer(_GRAD if full else _CHECK, grad, targets, 0)
        return targets

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        self._defer(_OUTPUT, t, target, index)

    def _defer(self, kind: int, t: torch.Tensor, who: Any, index: int) -> None:
        """Defer ``t``'s numbers of ``kind`` (a number that is finite unless ``t`` holds NaN/Inf
        or overflows: the L2 norm and the absmax of a gradient, else the L1 norm, as
        ``torch.sum`` has no ``out=`` for a whole tensor), and its NaN and Inf counts where
        ``t`` is not kept."""
        size = t.numel() * t.element_size()
        held: torch.Tensor | None = None
        if self._held_bytes + size <= self._hold_bytes:
            self._held_bytes += size
            held = t
        values = self._slots_of(t)
        first = 2 if kind == _GRAD else 1
        pos = values.take(first if held is not None else first + 2)
        slots = values.slots
        if t.requires_grad:  # a double backward (create_graph): out= ops take no such input
            t = t.detach()
        if kind == _GRAD:
            _norm_into(t, 2, slots[pos])
            _norm_into(t, math.inf, slots[pos + 1])
        else:
            _norm_into(t, 1, slots[pos])
        if held is None:
            nan, inf = _nan_inf(t)
            slots[pos + first].copy_(nan)
            slots[pos + first + 1].copy_(inf)
        self._queue += (kind, values, pos, who, index, held)

    def nonzero(self, t: torch.Tensor, target: list[Any], index: int) -> None:
        """Defer the count of ``t``'s non-zero elements into ``target[index]``: one reduction
        and its copy into a float32 slot (exact up to 2**24; above, rounded at the 8th digit)."""
        values = self._slots_of(t)
        pos = values.take(1)
        values.slots[pos].copy_(torch.count_nonzero(t))
        self._queue += (_NONZERO, values, pos, target, index, None)

    def param_norms(self, norms: list[torch.Tensor], grads: list[torch.Tensor],
                    fill: Callable[[list[int], list[float]], None], owners: list[int]) -> None:
        """Defer a batch of parameter norms (one device and dtype), read with the step's."""
        values = self._slots_of(norms[0])
        pos = values.take(len(norms))
        with torch.no_grad():  # a double backward's norms require grad: out= takes none
            torch.stack(norms, out=values.buffer[pos: pos + len(norms)])
        refill = functools.partial(self._refill, grads, fill, owners)
        self._queue += (_PARAMS, values, pos, refill, len(norms), None)

    def _refill(self, grads: list[torch.Tensor], fill: Callable[[list[int], list[float]], None],
                owners: list[int], values: list[float]) -> None:
        """Fill in parameter norms from the device; those that came back inf (maybe only their
        float32 sum of squares overflowed) are taken again in double, in the second transfer."""
        again = [j for j, value in enumerate(values) if value == math.inf]
        if not again:
            fill(owners, values)
            return

        def redo(numbers: list[float]) -> None:
            for j, norm in zip(again, numbers, strict=True):
                values[j] = norm
            fill(owners, values)

        self._follow_ups.append(([_wide_norm(grads[j]) for j in again], redo))

    def resolve(self) -> None:
        """Fill in every deferred number: one device-to-host transfer per device, and a second
        one where a kept tensor turned out to hold NaN/Inf."""
        if not self.deferred:
            return
        # the step's state is taken first: a transfer that fails leaves none behind
        queue, self._queue, self._held_bytes = self._queue, [], 0
        taken = [(values, values.used) for values in self._values.values() if values.used]
        for values, _ in taken:
            values.used = 0
        for values, used in taken:
            values.read = values.buffer[:used].tolist()
            self.transfers += 1
        entries = iter(queue)
        for kind, values, pos, who, index, held in zip(*[entries] * 6, strict=True):
            self._fill(kind, values.read, pos, who, index, held)
        for values in self._values.values():
            values.read = []
        follow_ups, self._follow_ups = self._follow_ups, []
        if follow_ups:
            self._transfer(follow_ups)

    def _fill(self, kind: int, read: list[float], pos: int, who: Any, index: int,
              held: torch.Tensor | None) -> None:
        first = read[pos]
        if kind == _PARAMS:
            who(read[pos: pos + index])
        elif kind == _NONZERO:
            who[index] = int(first)
        elif math.isfinite(first):
            if kind != _OUTPUT:
                _fill_targets(who, (first, read[pos + 1]) if kind == _GRAD else FINITE)
        else:
            absmax = read[pos + 1] if kind == _GRAD else math.nan
            counted = functools.partial(_counted, kind, who, index, absmax)
            if held is not None:  # the second transfer, that only a step with NaN/Inf pays
                self._follow_ups.append(([_wide_norm(held), *_nan_inf(held, torch.float64)],
                                         lambda v: counted(v[0], v[1], v[2])))
            else:
                at = pos + (2 if kind == _GRAD else 1)
                counted(first, read[at], read[at + 1])

    def _transfer(self, deferred: list[tuple[list[torch.Tensor], _Fill]]) -> None:
        by_device: dict[torch.device, list[tuple[list[torch.Tensor], _Fill]]] = {}
        for entry in deferred:
            by_device.setdefault(entry[0][0].device, []).append(entry)
        for entries in by_device.values():
            flat = torch.stack([n for numbers, _ in entries for n in numbers]).tolist()
            self.transfers += 1
            pos = 0
            for numbers, fill in entries:
                fill(flat[pos: pos + len(numbers)])
                pos += len(numbers)


def _counted(kind: int, who: Any, index: int, absmax: float, norm: float, nan: float,
             inf: float) -> None:
    """Fill in numbers that came back not finite, with their NaN and Inf counts."""
    if kind == _GRAD:
        _fill_targets(who, (norm, absmax) if math.isfinite(norm) else
                      (norm, absmax, int(nan), int(inf)))
    elif kind == _CHECK:  # no NaN/Inf: a float32 overflow
        _fill_targets(who, (norm, math.nan, int(nan), int(inf)) if nan or inf else FINITE)
    elif nan or inf:
        who.append([index, int(nan), int(inf)])


def _fill_targets(targets: Targets, stats: tuple[float, ...]) -> None:
    for k in range(0, len(targets), 2):
        targets[k][targets[k + 1]] = stats


def _norm_into(t: torch.Tensor, order: float, slot: torch.Tensor) -> None:
    """The ``order`` norm of ``t`` into a float32 slot, on its device, with no new tensor."""
    dtype = t.dtype
    if dtype is torch.float32 or dtype is torch.complex64:
        torch.linalg.vector_norm(t, ord=order, out=slot)
    elif dtype is torch.float16 or dtype is torch.bfloat16:  # summed in float32
        torch.linalg.vector_norm(t, ord=order, dtype=torch.float32, out=slot)
    else:  # double: its own result, copied in (float32 holds the 4 digits the log keeps)
        slot.copy_(torch.linalg.vector_norm(t, ord=order))


def _nan_inf(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """NaN and Inf counts of ``t``, as 0-d tensors on its device."""
    return [torch.isnan(t).sum(dtype=dtype), torch.isinf(t).sum(dtype=dtype)]


def _wide_norm(t: torch.Tensor) -> torch.Tensor:
    """The norm in double, for the second transfer: a float32 sum of squares overflows past
    1.8e19."""
    wide = torch.complex128 if t.is_complex() else torch.float64  # the norm of a complex is real
    norm: torch.Tensor = torch.linalg.vector_norm(t, dtype=wide)
    return norm

"""Gradient and activation statistics: norms, absolute maxima, NaN/Inf counts.

One interface (``TensorStats``), two implementations of its reductions: ``HostStats`` reads every
number at once (on CPU ``.item()`` costs no device sync), ``devicestats.DeviceStats`` leaves
them on the accelerator until the step ends. ``TensorStats`` picks one per tensor, and reduces a
gradient that is both a module's grad_output and the next one's grad_input once. The observers
call these; the log writes what they fill in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

import torch

from hooktrace.observe.devicestats import FINITE, DeviceStats, Targets

__all__ = ["DEFER_ENV", "FINITE", "HOLD_BYTES", "HostStats", "TensorStats", "on_host"]

#: Set to 1, CPU tensors take the accelerator's path (numbers kept as tensors until the step
#: ends): how the tests run that path on machines without an accelerator.
DEFER_ENV = "HOOKTRACE_DEFER_STATS"
#: Tensors kept alive until the step ends, so that NaN/Inf are counted only where a reduction
#: came back NaN/Inf; past this many bytes a step's tensors are counted at once instead.
HOLD_BYTES = 64 << 20

#: gradients met all zero or not finite on the host, counted in branches a usual one never
#: takes: whether a step's numbers hold one is known without looking at them
#: (``TensorStats.unusual``)
_UNUSUAL = [0]

#: a gradient's numbers: (norm, absmax(, nan, inf)) now, or the targets its deferred ones fill
_Numbers = tuple[float, ...] | Targets
_Fill = Callable[[list[int], list[float]], None]


class HostStats:
    """Reductions read at once: NaN/Inf are counted only when a cheap reduction is not finite
    (they propagate into it)."""

    def reduce(self, grad: torch.Tensor, full: bool) -> _Numbers:
        """(norm, absmax(, nan, inf)), a tuple the garbage collector does not track; not
        ``full``: FINITE, or those where the float32 sum is not finite (NaN, Inf, overflow)."""
        return FINITE if not full and math.isfinite(grad.sum().item()) else _host(grad)

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        if not math.isfinite(torch.sum(t, dtype=torch.float32).item()):
            nan, inf = _count_nonfinite(t)
            if nan or inf:
                target.append([index, nan, inf])

    def nonzero(self, t: torch.Tensor, target: list[Any], index: int) -> None:
        target[index] = int(torch.count_nonzero(t))

    def param_norms(self, norms: list[torch.Tensor], grads: list[torch.Tensor], fill: _Fill,
                    owners: list[int]) -> None:
        values = torch.stack(norms).tolist()
        for j, value in enumerate(values):
            if value == math.inf:  # maybe only the float32 sum of squares overflowed
                values[j] = torch.linalg.vector_norm(grads[j], dtype=torch.float64).item()
        fill(owners, values)


def on_host(tensors: list[torch.Tensor]) -> bool:
    """Whether numbers of ``tensors`` can be read now without waiting for a device (all on the
    CPU, the device path not forced): an observer outside the statistics reads its own only then."""
    return os.environ.get(DEFER_ENV) != "1" and all(t.is_cpu for t in tensors)


class TensorStats:
    """Gradient norms / absolute maxima and NaN/Inf checks, with one device sync per step: each
    tensor's numbers come from ``HostStats`` (CPU tensors, or every tensor with ``immediate``,
    as ``--break-on`` needs) or ``DeviceStats`` (until ``resolve()``)."""

    def __init__(self, immediate: bool = False) -> None:
        self._immediate = immediate  # read every number at once, also on a device (--break-on)
        self._defer_host = not immediate and os.environ.get(DEFER_ENV) == "1"
        self.hold_bytes = HOLD_BYTES  # tensors kept alive for a later look, at most
        self._host = HostStats()
        self._device = DeviceStats(self.hold_bytes)
        self._device_used = False  # until then nothing can wait for a device: deferred is False
        # the last gradient and its numbers: one gradient is often both a module's grad_output
        # and the next module's grad_input, and is reduced once
        self._last_grad: torch.Tensor | None = None
        self._last_numbers: _Numbers | None = None

    @property
    def deferred(self) -> bool:
        return self._device_used and self._device.deferred

    @property
    def unusual(self) -> int:
        """Grows when a gradient all zero or not finite was met; on a device, at every
        transfer (the numbers are not looked at on their way)."""
        return _UNUSUAL[0] + self._device.transfers

    @property
    def transfers(self) -> int:
        return self._device.transfers  # device-to-host transfers made by resolve (for the tests)

    def _for(self, t: torch.Tensor) -> HostStats | DeviceStats:
        if self._immediate or (t.is_cpu and not self._defer_host):
            return self._host
        self._device_used = True
        return self._device

    def grad(self, grad: torch.Tensor, target: list[Any], index: int, full: bool = True) -> None:
        """Set ``target[index]`` to (norm, absmax) (+ (nan, inf) counts when not finite);
        ``full=False`` (a watched step, which writes no event): ``FINITE`` if it is, by one sum."""
        if type(grad) is not torch.Tensor:  # a subclass: its local numbers, if any
            local = _local(grad)
            if local is None:
                return
            grad = local
        if (not grad.is_floating_point() and not grad.is_complex()) or grad.is_meta:
            return  # a meta tensor (shapes only) has no numbers
        if self._last_grad is grad:
            numbers = self._last_numbers
        else:
            if not grad.numel():
                numbers = (0.0, 0.0) if full or grad.is_complex() else FINITE
            else:
                numbers = self._for(grad).reduce(grad, full or grad.is_complex())
            self._last_grad, self._last_numbers = grad, numbers
        if isinstance(numbers, list):  # the targets of deferred numbers: [target, index, ...]
            numbers.append(target)
            numbers.append(index)
        else:
            target[index] = numbers

    def end_pass(self) -> None:
        # do not keep a gradient alive past its backward pass
        self._last_grad = self._last_numbers = None

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        """Append [index, nan, inf] to ``target`` when ``t`` holds NaN or Inf."""
        if type(t) is not torch.Tensor:
            local = _local(t)
            if local is None:
                return
            t = local
        if not t.is_floating_point() or t.numel() == 0 or t.is_meta:
            return
        self._for(t).nonfinite(t, target, index)

    def nonzero(self, t: torch.Tensor, target: list[Any], index: int) -> None:
        """Set ``target[index]`` to the number of ``t``'s non-zero elements."""
        if not t.is_meta:
            self._for(t).nonzero(t, target, index)

    def param_norms(self, groups: list[tuple[dict[str, Any], str, list[torch.Tensor]]]) -> None:
        """For each (target, key, grads): ``target[key]`` = the norm of all of ``grads``
        together, None when there are none. One fused norm per device and dtype for the whole
        step (``torch._foreach_norm``), not one per parameter."""
        squares = [0.0] * len(groups)
        flat: list[torch.Tensor] = []
        owners: list[int] = []
        for i, (target, key, grads) in enumerate(groups):
            target[key] = None
            flat += grads
            owners += [i] * len(grads)

        def fill(positions: list[int], values: list[float]) -> None:
            # the batch that adds a module's last share leaves its final norm
            mine = [owners[j] for j in positions]
            for i, norm in zip(mine, values, strict=True):
                squares[i] += norm * norm
            for i in mine:
                target, key, _ = groups[i]
                target[key] = math.sqrt(squares[i])

        self._fused_norms(flat, fill)

    def norms(self, tensors: list[torch.Tensor], into: list[float | None]) -> None:
        """``into[i]`` = the norm of ``tensors[i]`` (left as it is for one without numbers)."""
        def fill(positions: list[int], values: list[float]) -> None:
            for i, norm in zip(positions, values, strict=True):
                into[i] = norm

        self._fused_norms(tensors, fill)

    def _fused_norms(self, tensors: list[torch.Tensor], fill: _Fill) -> None:
        """``fill(positions, norms)`` once per device and dtype among ``tensors``; a norm that
        came back inf (maybe only its float32 sum of squares overflowed) is taken again in
        double."""
        for grads, positions in _batches(tensors):
            if any(g.is_sparse for g in grads):
                norms = [torch.linalg.vector_norm(g.coalesce().values()) for g in grads]
            else:
                norms = list(torch._foreach_norm(grads))
            if norms[0].dtype is not torch.float32:
                norms = [n.float() for n in norms]
            self._for(norms[0]).param_norms(norms, grads, fill, positions)

    def resolve(self) -> None:
        self._device.resolve()


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def _batches(tensors: list[torch.Tensor]) -> Iterable[tuple[list[torch.Tensor], list[int]]]:
    """The tensors with numbers of this process (their local shards), by device and dtype, and
    their positions among ``tensors``."""
    if _one_batch(tensors):  # the usual case: one look per tensor, in C
        return [(tensors, list(range(len(tensors))))]
    batches: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
    for i, g in enumerate(tensors):
        local = _local(g)
        if local is None or local.is_meta:
            continue
        batch = batches.setdefault((local.device, local.dtype), ([], []))
        batch[0].append(local)
        batch[1].append(i)
    return batches.values()


def _one_batch(tensors: list[torch.Tensor]) -> bool:
    """Plain tensors, none meta, all of one device and dtype (``_fused_norms``' one batch)."""
    return bool(tensors) and all(map(is_, map(type, tensors), repeat(torch.Tensor))) and (
        not any(map(_is_meta, tensors)) and len(set(map(_device, tensors))) == 1
        and len(set(map(_dtype, tensors))) == 1)


_is_meta, _device, _dtype = attrgetter("is_meta"), attrgetter("device"), attrgetter("dtype")


def _local(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose numbers this process holds: ``t`` itself (a plain tensor, or a plain
    subclass such as a Parameter); a distributed tensor's local shard (FSDP2, tensor parallel:
    its full numbers would cost collectives, inside a hook); None for a subclass without
    numbers of its own (a fake tensor)."""
    kind = type(t)
    if kind is torch.Tensor or kind.__torch_dispatch__ is _PLAIN_DISPATCH:
        return t
    to_local = getattr(t, "to_local", None)
    if to_local is None:
        return None
    with torch.no_grad():
        local = to_local()
    return local if type(local).__torch_dispatch__ is _PLAIN_DISPATCH else None


_SMALL = 1e-15  # an absolute max below this: float32 squares may underflow; take the double path


def _host(grad: torch.Tensor) -> tuple[float, ...]:
    """(norm, absmax(, nan, inf)) of a CPU tensor. An all-zero gradient (common where gradients
    vanish) costs one pass; a contiguous float32 one, the common case, a third less than the
    double norm: its squared norm as a BLAS dot product (also more accurate than vector_norm's
    float32 sum) unless its squares could under- or overflow."""
    if grad.dtype is not torch.float32 and grad.is_complex():
        m = torch.linalg.vector_norm(grad, ord=math.inf).item()
    else:
        low, high = torch.aminmax(grad)  # one pass; 4x cheaper than the inf-norm on CPU
        m = max(-low.item(), high.item())
        if m == 0.0:
            _UNUSUAL[0] += 1
            return (0.0, 0.0)
        if m > _SMALL and grad.dtype is torch.float32 and grad.is_contiguous():  # NaN is not
            flat = grad.view(-1)
            square = torch.dot(flat, flat).item()
            if square < math.inf:
                return (math.sqrt(square), m)
    # in double: a float32 (or half) sum of squares overflows long before the norm does
    n = torch.linalg.vector_norm(grad, dtype=None if grad.is_complex() else torch.float64).item()
    if n == 0.0 or not math.isfinite(n):
        _UNUSUAL[0] += 1
    return (n, m) if math.isfinite(n) else (n, m, *_count_nonfinite(grad))


def _count_nonfinite(t: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(t).sum().item()), int(torch.isinf(t).sum().item())

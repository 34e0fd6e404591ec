"""Gradient and activation statistics: norms, absolute maxima, NaN/Inf counts.

On CPU every number is read at once; on an accelerator they stay on the device until the step
ends (see ``Stats``). The tracer calls these; the log writes what they fill in.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import torch

#: Set to 1, CPU tensors take the accelerator's path (numbers kept as tensors until the step
#: ends): how the tests run that path on machines without an accelerator.
DEFER_ENV = "HOOKTRACE_DEFER_STATS"
#: Tensors kept alive until the step ends, so that NaN/Inf are counted only where a reduction
#: came back non-finite; past this many bytes a step's tensors are counted at once instead.
HOLD_BYTES = 64 << 20

#: What a watched step's finite gradient gets instead of its numbers (no event is written)
FINITE: tuple[float, ...] = (0.0, 0.0)

_Fill = Callable[[list[float]], None]


class _Values:
    """Where a device's reductions of one step land: slots of one float32 buffer, written with
    ``out=`` (no tensor object per number, nothing for Python's garbage collector to follow),
    read with one transfer when the step ends; plus the stacked parameter norms read with them.
    The buffer and its slots are kept from step to step."""

    __slots__ = ("buffer", "slots", "used", "params", "read")

    def __init__(self, device: torch.device) -> None:
        self.buffer = torch.empty(0, dtype=torch.float32, device=device)
        self.slots: list[torch.Tensor] = []  # 0-d views of the buffer, made once
        self.used = 0
        self.params: list[tuple[torch.Tensor, Callable[[list[float]], None]]] = []
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


# kinds of deferred entries, each then (values, first slot, who, index, kept tensor or None):
_GRAD = 0  # a gradient's norm and absmax; who: targets to fill
_CHECK = 1  # a watched gradient's one sum; who: targets to fill
_OUTPUT = 2  # a forward output's one sum; who: the list of NaN/Inf outputs, index: the output's
_STRIDE = 6


class Stats:
    """Gradient norms / absolute maxima and NaN/Inf checks, with one device sync per step.

    On CPU a number is read at once (``.item()`` costs no sync there), and NaN/Inf are counted
    only when a cheap reduction is not finite (they propagate into it). On an accelerator each
    tensor costs one or two reductions (a norm and an absolute max per gradient, an L1 norm per
    forward output), written into slots of one buffer per device (``_Values``); ``resolve()``
    brings all of a step's numbers to the host in one transfer per device. NaN/Inf in a tensor
    kept until then (``HOLD_BYTES``) are counted after that transfer, in a second one that only a
    step with NaN/Inf pays. A deferred number allocates no Python object that outlives its hook
    but the list of events it fills: objects that live for a step make Python's full garbage
    collections (0.1-0.3 s each with torch loaded) frequent.
    """

    def __init__(self, immediate: bool = False) -> None:
        self._immediate = immediate  # read every number at once, also on a device (--break-on)
        self._defer_host = not immediate and os.environ.get(DEFER_ENV) == "1"
        self._values: dict[torch.device, _Values] = {}
        # deferred entries, _STRIDE items each, flat: no tuple per entry
        self._entries: list[Any] = []
        self._params = False  # parameter norms wait in some _Values
        # tensors kept for counting NaN/Inf after resolve, and the bytes they hold
        self._held_bytes = 0
        self._follow_ups: list[tuple[torch.Tensor, _Fill]] = []
        self.transfers = 0  # device-to-host transfers made by resolve (for the tests)
        # the last gradient and its numbers: one gradient is often both a module's grad_output
        # and the next module's grad_input, and is reduced once
        self._last_grad: torch.Tensor | None = None
        self._last_numbers: Any = None

    @property
    def deferred(self) -> bool:
        return bool(self._entries) or self._params

    def _on_host(self, t: torch.Tensor) -> bool:
        return self._immediate or (t.is_cpu and not self._defer_host)

    def _hold(self, t: torch.Tensor) -> torch.Tensor | None:
        size = t.numel() * t.element_size()
        if self._held_bytes + size > HOLD_BYTES:
            return None
        self._held_bytes += size
        return t

    def _slots_of(self, t: torch.Tensor) -> _Values:
        device = t.device
        values = self._values.get(device)
        if values is None:
            values = self._values[device] = _Values(device)
        return values

    def grad(self, grad: torch.Tensor, target: list[Any], index: int, full: bool = True) -> None:
        """Set ``target[index]`` to (norm, absmax) (+ (nan, inf) counts when not finite).

        ``full=False`` (a watched step, which writes no event): only whether the gradient is
        finite, by one sum; a finite gradient gets ``FINITE``, not its numbers."""
        local = _local(grad)
        if local is None:
            return
        grad = local
        if (not grad.is_floating_point() and not grad.is_complex()) or grad.is_meta:
            return  # a meta tensor (shapes only) has no numbers
        if self._last_grad is grad:
            numbers = self._last_numbers
        else:
            numbers = (self._reduce(grad) if full or grad.is_complex()
                       else self._check_finite(grad))
            self._last_grad, self._last_numbers = grad, numbers
        if type(numbers) is tuple:
            target[index] = numbers
        else:  # the targets of deferred numbers, flat: [target, index, target, index, ...]
            numbers.append(target)
            numbers.append(index)

    def _reduce(self, grad: torch.Tensor) -> tuple[float, ...] | list[Any]:
        """(norm, absmax(, nan, inf)) on the host (a tuple of numbers: not tracked by the
        garbage collector); on a device, the list of targets that its deferred numbers fill."""
        if not grad.numel():
            return (0.0, 0.0)
        if self._on_host(grad):
            if grad.dtype is torch.float32 and grad.is_contiguous():
                return _host_float32(grad)
            return _host_any(grad)
        held = self._hold(grad)
        values = self._slots_of(grad)
        if grad.requires_grad:  # a double backward (create_graph): out= ops take no such input
            grad = grad.detach()
        pos = values.take(2 if held is not None else 4)
        slots = values.slots
        _norm_into(grad, 2, slots[pos])
        _norm_into(grad, math.inf, slots[pos + 1])
        if held is None:
            _count_into(grad, slots, pos + 2)
        targets: list[Any] = []
        self._entries.extend((_GRAD, values, pos, targets, 0, held))
        return targets

    def _check_finite(self, grad: torch.Tensor) -> tuple[float, ...] | list[Any]:
        """FINITE, or the full numbers of a gradient whose sum is not finite."""
        if not grad.numel():
            return FINITE
        if self._on_host(grad):
            # the full numbers where the float32 sum is not finite (NaN, Inf, or an overflow)
            return FINITE if math.isfinite(grad.sum().item()) else self._reduce(grad)
        targets: list[Any] = []
        self._sum(_CHECK, grad, targets, 0)
        return targets

    def _sum(self, kind: int, t: torch.Tensor, who: list[Any], index: int) -> None:
        """Defer one number of ``t`` that is finite unless ``t`` holds NaN/Inf (or overflows),
        and its NaN and Inf counts where ``t`` is not kept."""
        held = self._hold(t)
        values = self._slots_of(t)
        pos = values.take(1 if held is not None else 3)
        # the L1 norm (torch.sum has no out= for a whole tensor); detached: an out= op does not
        # take a tensor that requires grad
        _norm_into(t.detach(), 1, values.slots[pos])
        if held is None:
            _count_into(t, values.slots, pos + 1)
        self._entries.extend((kind, values, pos, who, index, held))

    def end_pass(self) -> None:
        # do not keep a gradient alive past its backward pass
        self._last_grad = self._last_numbers = None

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        """Append [index, nan, inf] to ``target`` when ``t`` holds NaN or Inf."""
        local = _local(t)
        if local is None:
            return
        t = local
        if not t.is_floating_point() or t.numel() == 0 or t.is_meta:
            return
        if self._on_host(t):
            if not math.isfinite(torch.sum(t, dtype=torch.float32).item()):
                nan, inf = _count_nonfinite(t)
                if nan or inf:
                    target.append([index, nan, inf])
            return
        self._sum(_OUTPUT, t, target, index)

    def param_norms(self, groups: list[tuple[dict[str, Any], str, list[torch.Tensor]]]) -> None:
        """For each (target, key, grads): ``target[key]`` = the norm of all of ``grads``
        together, None when there are none. One fused norm per device and dtype for the whole
        step (``torch._foreach_norm``), not one per parameter."""
        squares = [0.0] * len(groups)
        batches: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
        for i, (target, key, grads) in enumerate(groups):
            target[key] = None
            for g in map(_local, grads):
                if g is None or g.is_meta:
                    continue
                batch = batches.setdefault((g.device, g.dtype), ([], []))
                batch[0].append(g)
                batch[1].append(i)

        def fill(owners: list[int], values: list[float]) -> None:
            # the batch that adds a module's last share leaves its final norm
            for i, norm in zip(owners, values, strict=True):
                squares[i] += norm * norm
            for i in owners:
                target, key, _ = groups[i]
                target[key] = math.sqrt(squares[i])

        for grads, owners in batches.values():
            if any(g.is_sparse for g in grads):
                norms = [torch.linalg.vector_norm(g.coalesce().values()) for g in grads]
            else:
                norms = list(torch._foreach_norm(grads))
            if norms[0].dtype is not torch.float32:
                norms = [n.float() for n in norms]
            if self._on_host(norms[0]):
                values = torch.stack(norms).tolist()
                for j, value in enumerate(values):
                    if value == math.inf:  # maybe only the float32 sum of squares overflowed
                        values[j] = torch.linalg.vector_norm(grads[j], dtype=torch.float64).item()
                fill(owners, values)
            else:
                self._slots_of(norms[0]).params.append((torch.stack(norms), functools.partial(
                    self._refill, grads, fill, owners)))
                self._params = True

    def _refill(self, grads: list[torch.Tensor], fill: Callable[[list[int], list[float]], None],
                owners: list[int], values: list[float]) -> None:
        """Fill in parameter norms from the device; those that came back inf (maybe only their
        float32 sum of squares overflowed) are taken again in double, in the second transfer."""
        again = [j for j, value in enumerate(values) if value == math.inf]
        left = [len(again)]

        def redo(j: int, numbers: list[float]) -> None:
            values[j] = numbers[0]
            left[0] -= 1
            if not left[0]:
                fill(owners, values)

        for j in again:
            self._follow_ups.append((grads[j], functools.partial(redo, j)))
        if not again:
            fill(owners, values)

    def resolve(self) -> None:
        """Fill in every deferred number: one device-to-host transfer per device, and a second
        one where a kept tensor turned out to hold NaN/Inf."""
        if not self.deferred:
            return
        # the step's state is taken first: a transfer that fails leaves none behind
        entries, self._entries, self._params, self._held_bytes = self._entries, [], False, 0
        taken = [(values, values.used, values.params) for values in self._values.values()]
        for values, _, _ in taken:
            values.used, values.params = 0, []
        params = []
        for values, used, waiting in taken:
            parts = [t for t, _ in waiting]
            if used:
                parts.insert(0, values.buffer[:used])
            if parts:
                values.read = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()
                self.transfers += 1
            offset = used
            for t, then in waiting:
                params.append((then, values.read[offset: offset + len(t)]))
                offset += len(t)
        for k in range(0, len(entries), _STRIDE):
            self._fill(*entries[k: k + _STRIDE])
        for then, read in params:
            then(read)
        for values in self._values.values():
            values.read = []
        follow_ups, self._follow_ups = self._follow_ups, []
        if follow_ups:
            self._transfer([_follow_up(t, then) for t, then in follow_ups])

    def _fill(self, kind: int, values: _Values, pos: int, who: list[Any], index: int,
              held: torch.Tensor | None) -> None:
        read = values.read
        first = read[pos]
        if math.isfinite(first):
            if kind == _GRAD:
                _fill_targets(who, (first, read[pos + 1]))
            elif kind == _CHECK:
                _fill_targets(who, FINITE)
            return
        absmax = read[pos + 1] if kind == _GRAD else math.nan

        def counted(norm: float, nan: float, inf: float) -> None:
            if kind == _OUTPUT:
                if nan or inf:
                    who.append([index, int(nan), int(inf)])
            elif kind == _CHECK and not (nan or inf):
                _fill_targets(who, FINITE)  # a float32 overflow, no NaN/Inf
            else:
                _fill_targets(who, (norm, absmax) if math.isfinite(norm) else
                              (norm, absmax, int(nan), int(inf)))

        if held is not None:  # the second transfer, that only a step with NaN/Inf pays
            self._follow_ups.append((held, lambda v: counted(v[0], v[1], v[2])))
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


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


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


def _fill_targets(targets: list[Any], stats: tuple[float, ...]) -> None:
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


def _count_into(t: torch.Tensor, slots: list[torch.Tensor], pos: int) -> None:
    """NaN and Inf counts of ``t`` into ``slots[pos]`` and ``slots[pos + 1]``."""
    nan, inf = _counts(t)
    slots[pos].copy_(nan)
    slots[pos + 1].copy_(inf)


def _counts(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """NaN and Inf counts of ``t``, as 0-d tensors on its device."""
    return [torch.isnan(t).sum(dtype=dtype), torch.isinf(t).sum(dtype=dtype)]


def _follow_up(t: torch.Tensor, then: _Fill) -> tuple[list[torch.Tensor], _Fill]:
    """The second transfer, for a kept tensor whose reduction was not finite: its norm in
    double (a float32 sum of squares overflows past 1.8e19) and its NaN and Inf counts."""
    wide = torch.complex128 if t.is_complex() else torch.float64  # the norm of a complex is real
    return [torch.linalg.vector_norm(t, dtype=wide), *_counts(t, torch.float64)], then


def _host_any(grad: torch.Tensor) -> tuple[float, ...]:
    """(norm, absmax(, nan, inf)) of a CPU tensor that is not contiguous float32."""
    if grad.is_complex():
        norm = torch.linalg.vector_norm(grad)
        m = torch.linalg.vector_norm(grad, ord=math.inf).item()
    else:
        # in double: a float32 (or half) sum of squares overflows long before the norm does
        norm = torch.linalg.vector_norm(grad, dtype=torch.float64)
        low, high = torch.aminmax(grad)  # one pass; 4x cheaper than the inf-norm on CPU
        m = max(-low.item(), high.item())
    n = norm.item()
    return (n, m) if math.isfinite(n) else (n, m, *_count_nonfinite(grad))


_SMALL = 1e-15  # an absolute max below this: float32 squares may underflow; take the double path


def _host_float32(grad: torch.Tensor) -> tuple[float, ...]:
    """The common CPU case, a third cheaper: the absolute max, then the squared norm as a BLAS
    dot product (also more accurate than vector_norm's float32 sum) unless its squares could
    under- or overflow. An all-zero gradient (common where gradients vanish) costs one pass."""
    flat = grad.view(-1)
    low, high = torch.aminmax(flat)
    m = max(-low.item(), high.item())
    if m == 0.0:
        return (0.0, 0.0)
    if m > _SMALL:  # NaN is not
        square = torch.dot(flat, flat).item()
        if square < math.inf:
            return (math.sqrt(square), m)
    n = torch.linalg.vector_norm(grad, dtype=torch.float64).item()
    return (n, m) if math.isfinite(n) else (n, m, *_count_nonfinite(grad))


def _count_nonfinite(t: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(t).sum().item()), int(torch.isinf(t).sum().item())

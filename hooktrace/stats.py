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
_Bad = tuple[float, float, float] | None  # (norm in double, NaN count, Inf count)


class Stats:
    """Gradient norms / absolute maxima and NaN/Inf checks, with one device sync per step.

    On CPU a number is read at once (``.item()`` costs no sync there), and NaN/Inf are counted
    only when a cheap reduction is not finite (they propagate into it). On an accelerator each
    tensor costs one or two reductions (a norm and an absolute max per gradient, a sum per
    forward output), left on the device; ``resolve()`` brings all of a step's numbers to the host
    in one transfer per device. NaN/Inf in a tensor kept until then (``HOLD_BYTES``) are counted
    after that transfer, in a second one that only a step with NaN/Inf pays.
    """

    def __init__(self, immediate: bool = False) -> None:
        self._immediate = immediate  # read every number at once, also on a device (--break-on)
        self._defer_host = not immediate and os.environ.get(DEFER_ENV) == "1"
        # 0-d float32 tensors on a device, each run of them with what to do with its values
        self._deferred: list[tuple[list[torch.Tensor], _Fill]] = []
        # tensors kept for counting NaN/Inf after resolve, and the bytes they hold
        self._held_bytes = 0
        self._follow_ups: list[tuple[torch.Tensor, _Fill]] = []
        self.transfers = 0  # device-to-host transfers made by resolve (for the tests)
        # the last gradient and its numbers: one gradient is often both a module's grad_output
        # and the next module's grad_input, and is reduced once
        self._last: tuple[torch.Tensor | None, Any] = (None, None)

    @property
    def deferred(self) -> bool:
        return bool(self._deferred)

    def _on_host(self, t: torch.Tensor) -> bool:
        return self._immediate or (t.is_cpu and not self._defer_host)

    def _hold(self, t: torch.Tensor) -> bool:
        size = t.numel() * t.element_size()
        if self._held_bytes + size > HOLD_BYTES:
            return False
        self._held_bytes += size
        return True

    def grad(self, grad: torch.Tensor, target: list[Any], index: int, full: bool = True) -> None:
        """Set ``target[index]`` to (norm, absmax) (+ (nan, inf) counts when not finite).

        ``full=False`` (a watched step, which writes no event): only whether the gradient is
        finite, by one sum; a finite gradient gets ``FINITE``, not its numbers."""
        if not grad.is_floating_point() and not grad.is_complex():
            return
        last, numbers = self._last
        if last is not grad:
            numbers = (self._reduce(grad) if full or grad.is_complex()
                       else self._check_finite(grad))
            self._last = (grad, numbers)
        if isinstance(numbers, tuple):
            target[index] = numbers
        else:
            numbers.append((target, index))

    def _reduce(self, grad: torch.Tensor) -> tuple[float, ...] | list[tuple[list[Any], int]]:
        """(norm, absmax(, nan, inf)) on the host (a tuple of numbers: not tracked by the
        garbage collector); on a device, the list of targets that its deferred numbers fill."""
        if not grad.numel():
            return (0.0, 0.0)
        if self._on_host(grad):
            if grad.dtype is torch.float32 and grad.is_contiguous():
                return _host_float32(grad)
            return _host_any(grad)
        targets: list[tuple[list[Any], int]] = []
        half = grad.dtype in (torch.float16, torch.bfloat16)
        norm = torch.linalg.vector_norm(grad, dtype=torch.float32 if half else None)
        absmax = torch.linalg.vector_norm(grad, ord=math.inf)

        def done(values: list[float], bad: _Bad) -> None:
            n, m = values
            stats: tuple[float, ...] = (n, m)
            if bad is not None:
                n = bad[0]
                stats = (n, m) if math.isfinite(n) else (n, m, int(bad[1]), int(bad[2]))
            for target, index in targets:
                target[index] = stats

        self._defer(grad, [norm, absmax], done)
        return targets

    def _check_finite(self, grad: torch.Tensor) -> tuple[float, ...] | list[tuple[list[Any],
                                                                                 int]]:
        """FINITE, or the full numbers of a gradient whose sum is not finite."""
        if not grad.numel():
            return FINITE
        if self._on_host(grad):
            # the full numbers where the float32 sum is not finite (NaN, Inf, or an overflow)
            return FINITE if math.isfinite(grad.sum().item()) else self._reduce(grad)
        targets: list[tuple[list[Any], int]] = []

        def done(values: list[float], bad: _Bad) -> None:
            stats = FINITE if bad is None or not (bad[1] or bad[2]) else (
                bad[0], math.nan, int(bad[1]), int(bad[2]))
            for target, index in targets:
                target[index] = stats

        self._defer(grad, [torch.sum(grad, dtype=torch.float32)], done)
        return targets

    def _defer(self, t: torch.Tensor, numbers: list[torch.Tensor],
               done: Callable[[list[float], _Bad], None]) -> None:
        """Leave ``numbers``, reductions of ``t`` on its device, for ``resolve``; then call
        ``done(values, None)``, or ``done(values, (norm, nan, inf))`` where the first value is not
        finite (NaN/Inf in ``t``, or a float32 overflow): ``t``'s NaN and Inf counts, and its norm
        in double. ``t`` is kept for that until the step ends, within HOLD_BYTES; past them its
        counts are taken at once, and the norm given is the first value."""
        if self._hold(t):
            def fill(values: list[float]) -> None:
                if math.isfinite(values[0]):
                    done(values, None)
                else:  # the second transfer, that only a step with NaN/Inf pays
                    self._follow_ups.append((t, lambda v: done(values, (v[0], v[1], v[2]))))
        else:
            size = len(numbers)
            numbers = [*numbers, *_counts(t)]

            def fill(values: list[float]) -> None:
                first = values[0]
                done(values[:size], None if math.isfinite(first) else
                     (first, values[size], values[size + 1]))

        self._deferred.append((numbers, fill))

    def end_pass(self) -> None:
        self._last = (None, None)  # do not keep a gradient alive past its backward pass

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        """Append [index, nan, inf] to ``target`` when ``t`` holds NaN or Inf."""
        if not t.is_floating_point() or t.numel() == 0:
            return
        if self._on_host(t):
            if not math.isfinite(torch.sum(t, dtype=torch.float32).item()):
                nan, inf = _count_nonfinite(t)
                if nan or inf:
                    target.append([index, nan, inf])
            return

        def done(values: list[float], bad: _Bad) -> None:
            if bad is not None and (bad[1] or bad[2]):
                target.append([index, int(bad[1]), int(bad[2])])

        self._defer(t, [torch.sum(t, dtype=torch.float32)], done)

    def param_norms(self, groups: list[tuple[dict[str, Any], str, list[torch.Tensor]]]) -> None:
        """For each (target, key, grads): ``target[key]`` = the norm of all of ``grads``
        together, None when there are none. One fused norm per device and dtype for the whole
        step (``torch._foreach_norm``), not one per parameter."""
        squares = [0.0] * len(groups)
        batches: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
        for i, (target, key, grads) in enumerate(groups):
            target[key] = None
            for g in grads:
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
                self._deferred.append((norms, functools.partial(self._refill, grads, fill,
                                                                owners)))

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
        self._transfer(self._deferred)
        self._deferred, self._held_bytes = [], 0
        follow_ups, self._follow_ups = self._follow_ups, []
        if follow_ups:
            self._transfer([_follow_up(t, then) for t, then in follow_ups])

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

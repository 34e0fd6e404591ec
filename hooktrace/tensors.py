"""Tensor leaves of nested module inputs/outputs, and their shape/dtype summaries.

Handles tensors, tuples/lists (namedtuples too), dicts (HF ``ModelOutput`` is one), dataclasses
and None; other leaves are ignored. ``torch.utils._pytree`` misses dataclasses, hence this walk.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

MAX_LEAVES = 64  # tensor leaves kept per side of a call; more are counted, not listed
_MAX_DEPTH = 8

_dtype_names: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def _walk(obj: Any, out: list[torch.Tensor], depth: int) -> int:
    """Append tensor leaves of ``obj`` to ``out`` (up to MAX_LEAVES); return how many were seen."""
    if isinstance(obj, torch.Tensor):
        if len(out) < MAX_LEAVES:
            out.append(obj)
        return 1
    if depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return 0
    if isinstance(obj, (list, tuple)):
        items: Any = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = (getattr(obj, f.name, None) for f in dataclasses.fields(obj))
    else:
        return 0
    seen = 0
    for item in items:
        seen += _walk(item, out, depth + 1)
    return seen


_Tensor = torch.Tensor


def leaves(*objs: Any) -> tuple[list[torch.Tensor], int]:
    """Tensor leaves of ``objs`` in order, and how many leaves there were in all."""
    if len(objs) == 1:
        obj = objs[0]
        if type(obj) is tuple and len(obj) <= MAX_LEAVES:
            # the common case, a module's positional args: plain tensors, no walk needed
            if all(type(x) is _Tensor for x in obj):
                return list(obj), len(obj)
        elif type(obj) is _Tensor:
            return [obj], 1
    out: list[torch.Tensor] = []
    seen = 0
    for obj in objs:
        if isinstance(obj, torch.Tensor):  # the common case, without the walk
            if len(out) < MAX_LEAVES:
                out.append(obj)
            seen += 1
        elif obj is not None:
            seen += _walk(obj, out, 0)
    return out, seen


def shape_of(t: torch.Tensor) -> tuple[int, ...]:
    """A plain tuple, not the torch.Size: a tuple of ints is hashable (the log interns shapes)
    and Python's garbage collector stops tracking it, where it keeps tracking a Size."""
    try:
        return tuple(t.shape)
    except RuntimeError:  # nested/jagged tensors have no single shape
        return ()


def summarize(tensors: list[torch.Tensor]) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Shapes and dtype names of ``tensors``, as tuples (the log interns them)."""
    shapes: tuple[tuple[int, ...], ...]
    try:
        shapes = tuple([tuple(t.shape) for t in tensors])
    except RuntimeError:  # a nested tensor among them
        shapes = tuple([shape_of(t) for t in tensors])
    names = _dtype_names
    try:
        return shapes, tuple([names[t.dtype] for t in tensors])
    except KeyError:
        return shapes, tuple([dtype_name(t.dtype) for t in tensors])


class Stats:
    """Gradient norms / absolute maxima and NaN/Inf checks, with one device sync per step.

    On CPU a number is read at once (``.item()`` costs no sync there); on an accelerator the
    reductions stay on the device and ``resolve()`` brings all of a step's numbers to the host in
    one transfer per device. On CPU, NaN/Inf are counted only when a cheap reduction is not
    finite (they propagate into it).
    """

    def __init__(self, immediate: bool = False) -> None:
        self._immediate = immediate  # read every number at once, also on a device (--break-on)
        # device tensors of numbers, each with what to do with their values on the host
        self._deferred: list[tuple[torch.Tensor, Callable[[list[float]], None]]] = []
        # the last gradient and its numbers: one gradient is often both a module's grad_output
        # and the next module's grad_input, and is reduced once
        self._last: tuple[torch.Tensor | None, Any] = (None, None)

    @property
    def deferred(self) -> bool:
        return bool(self._deferred)

    def grad(self, grad: torch.Tensor, target: list[Any], index: int) -> None:
        """Set ``target[index]`` to (norm, absmax) (+ (nan, inf) counts when not finite)."""
        if not grad.is_floating_point() and not grad.is_complex():
            return
        last, numbers = self._last
        if last is not grad:
            numbers = self._reduce(grad)
            self._last = (grad, numbers)
        if isinstance(numbers, tuple):
            target[index] = numbers
            return

        def fill(values: list[float]) -> None:
            n, m, nan, inf = values
            target[index] = (n, m) if math.isfinite(n) else (n, m, int(nan), int(inf))

        self._deferred.append((numbers, fill))

    def _reduce(self, grad: torch.Tensor) -> tuple[float, ...] | torch.Tensor:
        """(norm, absmax(, nan, inf)) on CPU (a tuple of numbers: not tracked by the garbage
        collector); on a device, a tensor of the four numbers."""
        if not grad.numel():
            return (0.0, 0.0)
        on_host = grad.device.type == "cpu"
        if on_host and grad.dtype is torch.float32 and grad.is_contiguous():
            return _host_float32(grad)
        if grad.is_complex():
            norm = torch.linalg.vector_norm(grad)
            low, high = -norm, torch.linalg.vector_norm(grad, ord=math.inf)
        else:
            # in double: a float32 (or half) sum of squares overflows long before the norm does
            norm = torch.linalg.vector_norm(grad, dtype=torch.float64)
            low, high = torch.aminmax(grad)  # one pass; 4x cheaper than the inf-norm on CPU
        if on_host or self._immediate:
            n = norm.item()
            m = max(-low.item(), high.item())
            return (n, m) if math.isfinite(n) else (n, m, *_count_nonfinite(grad))
        return torch.stack([norm.float(), torch.maximum(-low, high).float(),
                            torch.isnan(grad).sum().float(), torch.isinf(grad).sum().float()])

    def end_pass(self) -> None:
        self._last = (None, None)  # do not keep a gradient alive past its backward pass

    def nonfinite(self, t: torch.Tensor, target: list[list[int]], index: int) -> None:
        """Append [index, nan, inf] to ``target`` when ``t`` holds NaN or Inf."""
        if not t.is_floating_point() or t.numel() == 0:
            return
        if t.device.type == "cpu" or self._immediate:
            if not math.isfinite(torch.sum(t, dtype=torch.float32).item()):
                nan, inf = _count_nonfinite(t)
                if nan or inf:
                    target.append([index, nan, inf])
            return

        def fill(values: list[float]) -> None:
            if values[0] or values[1]:
                target.append([index, int(values[0]), int(values[1])])

        self._deferred.append(
            (torch.stack([torch.isnan(t).sum(), torch.isinf(t).sum()]).float(), fill))

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
                norms = torch.stack([torch.linalg.vector_norm(g.coalesce().values())
                                     for g in grads]).float()
            else:
                norms = torch.stack(torch._foreach_norm(grads)).float()
            if norms.device.type == "cpu":
                values = norms.tolist()
                for j, value in enumerate(values):
                    if value == math.inf:  # maybe only the float32 sum of squares overflowed
                        values[j] = torch.linalg.vector_norm(grads[j], dtype=torch.float64).item()
                fill(owners, values)
            else:
                self._deferred.append((norms, functools.partial(fill, owners)))

    def resolve(self) -> None:
        """Fill in every deferred number: one device-to-host transfer per device."""
        deferred, self._deferred = self._deferred, []
        by_device: dict[torch.device, list[tuple[torch.Tensor, Callable[[list[float]], None]]]] = {}
        for entry in deferred:
            by_device.setdefault(entry[0].device, []).append(entry)
        for entries in by_device.values():
            flat = torch.cat([numbers for numbers, _ in entries]).tolist()
            pos = 0
            for numbers, fill in entries:
                fill(flat[pos: pos + numbers.numel()])
                pos += numbers.numel()


_TINY = 1e-30  # below this a float32 sum of squares may have underflowed


def _host_float32(grad: torch.Tensor) -> tuple[float, ...]:
    """The common CPU case, a third cheaper: the squared norm as a BLAS dot product (also more
    accurate than vector_norm's float32 sum), unless it under- or overflowed."""
    flat = grad.view(-1)
    square = torch.dot(flat, flat).item()
    low, high = torch.aminmax(flat)
    m = max(-low.item(), high.item())
    if _TINY < square < math.inf:
        return (math.sqrt(square), m)
    n = torch.linalg.vector_norm(grad, dtype=torch.float64).item()
    return (n, m) if math.isfinite(n) else (n, m, *_count_nonfinite(grad))


def _count_nonfinite(t: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(t).sum().item()), int(torch.isinf(t).sum().item())

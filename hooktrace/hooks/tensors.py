"""Tensor leaves of nested module inputs/outputs, and their shape/dtype summaries.

Handles tensors, tuples/lists (namedtuples too), dicts (HF ``ModelOutput`` is one), dataclasses
and None; other leaves are ignored. ``torch.utils._pytree`` misses dataclasses, hence this walk.
"""

from __future__ import annotations

import dataclasses
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

import torch

Summary = tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]  # shapes, dtypes
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
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")


def leaves(*objs: Any) -> tuple[list[torch.Tensor], int]:
    """Tensor leaves of ``objs`` in order, and how many leaves there were in all."""
    if len(objs) == 1:
        obj = objs[0]
        if type(obj) is tuple and len(obj) <= MAX_LEAVES:
            # the common case, a module's positional args: plain tensors, no walk needed
            if all(map(is_, map(type, obj), repeat(_Tensor))):  # in C: no generator
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


def summarize(tensors: list[torch.Tensor]) -> Summary:
    """Shapes and dtype names of ``tensors``, as tuples (the log interns them)."""
    shapes: tuple[tuple[int, ...], ...]
    try:  # map, not a comprehension: per tensor in C
        shapes = tuple(map(tuple, map(_shape, tensors)))
    except RuntimeError:  # a nested tensor among them
        shapes = tuple([shape_of(t) for t in tensors])
    try:
        return shapes, tuple(map(_dtype_names.__getitem__, map(_dtype, tensors)))
    except KeyError:
        return shapes, tuple([dtype_name(t.dtype) for t in tensors])

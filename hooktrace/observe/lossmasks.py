"""How much of its batch a loss reads, read from the loss's autograd graph as ``backward()``
begins: a 0/1 mask that multiplies the per-element loss (``(loss * mask).sum()``), a boolean
index (``loss[mask]``, ``masked_select``), a ``torch.where(mask, loss, 0)``, an integer tensor
of 0s and 1s used as an index (it picks rows 0 and 1, not the rows the mask keeps), and the
targets an ``F.cross_entropy``/``F.nll_loss`` the window did not see (one computed inside a
model's call, ``model(ids, labels=labels).loss``) leaves to ``ignore_index``.

Only the loss's top is walked (sums, scales, means, views and the ops that pick elements),
down to the traced calls' outputs, at most ``_BUDGET`` nodes; saved tensors are read without
unpacking them (none behind an unpack hook: that would run the program's code). What it finds
is counted on the tensors' device (a few ops, no read): the counts are read once as the pass
ends (``lossterms.py``). A multiplier with values other
than 0 and 1 (a focal or class weight) is a weight, not a mask: said nothing of."""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

import torch

from hooktrace.hooks.gradhooks import output_calls

_BUDGET = 64
#: nodes a loss's elements pass through on the way to its root: sums, scales, means, views,
#: and the ops that pick some of them
_THROUGH = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sum", "Mean", "Stack", "Cat", "View",
                      "Squeeze", "Unsqueeze", "Reshape", "Clone", "ToCopy", "Index",
                      "MaskedSelect", "Where", "Expand", "Permute", "Transpose"})
_NLL = frozenset({"NllLoss", "NllLoss2D"})


class Share(NamedTuple):
    """What one op of a loss reads: ``read`` elements of ``of`` (a 0-dim count on its device),
    ``bad`` the multiplier's values that are neither 0 nor 1 (a weight where not 0)."""

    detail: dict[str, Any]
    read: torch.Tensor
    bad: torch.Tensor
    of: int


def _op(node: Any) -> str:
    name = type(node).__name__
    cut = name.rfind("Backward")
    return name[:cut] if cut > 0 else name


def _edges(node: Any) -> list[bool]:
    """Which inputs of ``node`` carry a gradient."""
    return [child is not None for child, _ in node.next_functions]


class _Hooked(Exception):
    """A saved tensor behind an unpack hook (activation checkpointing, offloading): reading it
    would run the program's hook, so the op is not read."""


def _saved(raw: Any) -> Any:
    """A saved tensor read without unpacking it (None where it was not saved)."""
    if raw.unpack_hook is not None:
        raise _Hooked
    return raw.data


def _not01(t: torch.Tensor) -> torch.Tensor:
    return ((t != 0) & (t != 1)).sum()


def _mul(node: Any) -> Share | None:
    """``loss * mask``: the operand without gradient is the mask, broadcast to the product."""
    edges = _edges(node)
    if edges.count(True) != 1 or len(edges) != 2:
        return None
    mask = _saved(node._raw_saved_self if edges[1] else node._raw_saved_other)
    shape = node._input_metadata[0].shape
    of = math.prod(shape)
    if not isinstance(mask, torch.Tensor) or mask.numel() <= 1 or of <= 1:
        return None  # a scale
    read = torch.count_nonzero(mask) * (of // mask.numel())
    return Share({"by": "mask", "node": "Mul"}, read, _not01(mask), of)


def _where(node: Any) -> Share | None:
    """``torch.where(mask, loss, 0)``: the loss's side of the condition."""
    edges = _edges(node)
    cond = _saved(node._raw_saved_condition)
    if edges.count(True) != 1 or cond.numel() <= 1:
        return None
    kept = cond if edges[0] else ~cond
    return Share({"by": "mask", "node": "Where"}, torch.count_nonzero(kept),
                 torch.zeros((), dtype=torch.int64, device=cond.device), cond.numel())


def _masked_select(node: Any) -> Share | None:
    mask, loss = _saved(node._raw_saved_mask), _saved(node._raw_saved_self)
    shape = torch.broadcast_shapes(mask.shape, loss.shape)  # type: ignore[no-untyped-call]
    read = torch.count_nonzero(torch.broadcast_to(mask, shape))
    return Share({"by": "mask", "node": "MaskedSelect"}, read,
                 torch.zeros((), dtype=torch.int64, device=mask.device), math.prod(shape))


def _index(node: Any) -> Share | None:
    """``loss[mask]``: one boolean index; an integer index of the dimension's length whose
    values are all 0 or 1 (``bad`` zero) is a mask of the wrong dtype."""
    sizes = list(node._saved_self_sym_sizes)
    found = [(i, _saved(ix)) for i, ix in enumerate(node._raw_saved_indices)
             if ix is not None]
    found = [(i, ix) for i, ix in found if ix is not None]
    if len(found) != 1 or math.prod(sizes) <= 1:
        return None
    (dim, ix), of = found[0], math.prod(sizes)
    if ix.dtype in (torch.bool, torch.uint8):  # uint8 indexes as a mask
        rest = of // max(math.prod(sizes[dim:dim + ix.dim()]), 1)
        return Share({"by": "mask", "node": "Index"}, torch.count_nonzero(ix) * rest,
                     torch.zeros((), dtype=torch.int64, device=ix.device), of)
    if ix.is_floating_point() or ix.dim() != 1 or ix.numel() != sizes[dim] or sizes[dim] <= 2:
        return None
    rows = (ix == 0).any().long() + (ix == 1).any().long()  # the rows it reads
    return Share({"by": "index", "node": "Index", "dim": dim, "rows": sizes[dim]},
                 rows * (of // sizes[dim]), _not01(ix), of)


def _nll(node: Any) -> Share | None:
    """Targets a ``nll_loss`` left to ``ignore_index`` (one the window did not see)."""
    target, ignore = _saved(node._raw_saved_target), node._saved_ignore_index
    if target.numel() == 0:
        return None
    below = node.next_functions[0][0]
    loss = "F.cross_entropy" if below is not None and _op(below) == "LogSoftmax" else \
        "F.nll_loss"
    return Share({"by": "ignore_index", "node": _op(node), "loss": loss,
                  "ignore_index": int(ignore), "inside": True},
                 (target != ignore).sum(), torch.zeros((), dtype=torch.int64,
                                                        device=target.device), target.numel())


_READERS = {"Mul": _mul, "Where": _where, "MaskedSelect": _masked_select, "Index": _index,
            "NllLoss": _nll, "NllLoss2D": _nll}


def reads(roots: list[Any], known: set[Any]) -> list[Share]:
    """The shares read on the loss's top below ``roots``, down to the traced calls' outputs;
    ``known``: the nodes of losses the window counted already (not walked below)."""
    out: list[Share] = []
    seen = set(roots)
    queue = deque(roots)
    while queue and len(seen) < _BUDGET:
        node = queue.popleft()
        if node in known or (node not in roots and output_calls(node)):
            continue  # counted by the window, or a model call's output: inside the model
        op = _op(node)
        reader = _READERS.get(op)
        try:
            share = reader(node) if reader is not None else None
        except _Hooked:
            share = None
        if share is not None:
            out.append(share)
        if op in _NLL or op not in _THROUGH:
            continue
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                queue.append(child)
    return out

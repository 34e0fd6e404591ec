"""The loss's autograd graph, read as ``backward()`` begins (``loss.py`` holds what is read):
each loss function's ops back to the model's output, the scaler's scale multiplications, the
arithmetic top where terms meet, the share of its batch a loss reads, a regression target that
reaches the model it trains, and the traced calls a tensor was computed from.

Every walk is breadth first and bounded (a few dozen nodes), stops at the nodes that made a
traced call's output (the core's gradient hooks mark them), and only reads: no hook is added,
and a saved tensor behind an unpack hook is never read (that would re-run a checkpointed
forward or the program's own hook). The masks and counts found are computed on the tensors'
device (a few ops, no read): they are read once as the pass ends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from hooktrace.hooks.gradhooks import output_calls
from hooktrace.hooks.naming import ModInfo
from hooktrace.log import schema

_BUDGET = 64  # autograd nodes one walk visits at most
_CHAIN = 12  # nodes followed from a loss's input back to the model's output
_SIDE_BUDGET = 32  # nodes looked at from each side of a regression loss, or back to the calls
#: ops a loss goes through on its way to backward (a scale, a mean, a sum of losses)
_ARITH = frozenset({"Mul", "Div", "Add", "Sub", "Neg", "Sum", "Mean"})
#: the loss's arithmetic top: where its terms meet (sums, scales, means, views)
_TOP = _ARITH | {"Stack", "Cat", "View", "Squeeze", "Unsqueeze", "Reshape", "Clone", "ToCopy"}
#: the ops a loss's elements pass through to its root, with those that pick some of them
_THROUGH = _TOP | {"Index", "MaskedSelect", "Where", "Expand", "Permute", "Transpose"}
_NLL = frozenset({"NllLoss", "NllLoss2D"})
_MAXES = frozenset({"Max", "Amax", "Logsumexp"})  # a max over an output (a bootstrapped target)


def op_name(node: Any) -> str:
    name = type(node).__name__
    cut = name.rfind("Backward")
    return name[:cut] if cut > 0 else name


def is_loss(op: str) -> bool:
    return "Loss" in op or op.startswith("BinaryCrossEntropy")


def _children(node: Any) -> Iterable[Any]:
    return (child for child, _ in node.next_functions if child is not None)


def breadth(roots: list[Any], budget: int, below: Callable[[Any], Iterable[Any]]) -> set[Any]:
    """The nodes met breadth first from ``roots``, at most ``budget``; ``below(node)``: the
    nodes to go on to (it reads the node on the way)."""
    seen = set(roots)
    queue = deque(roots)
    while queue and len(seen) < budget:
        for child in below(queue.popleft()):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return seen


# -- each loss function's ops, and the scale ----------------------------------------------------
class Loss(NamedTuple):
    """A loss function's node, and the path from its input back to a traced call's output."""

    op: str
    ops: tuple[str, ...]  # between the loss and the output, the loss's input first
    out: str  # the op that made the output (below views and casts)
    outer: ModInfo  # the outermost call that returned it
    inner: ModInfo  # the innermost


class GraphWalk(NamedTuple):
    losses: list[Loss]
    models: set[int]  # the models whose outputs the walk reached
    scales: int  # the most scale multiplications on one path; -1: no scaler known


def is_scale(node: Any, ptr: int) -> bool:
    """``node`` multiplies by the tensor at ``ptr`` (a scaler's scale). The saved tensor is read
    without unpacking it: an unpack hook (activation checkpointing) would recompute."""
    if type(node).__name__ != "MulBackward0":
        return False
    saved = node._raw_saved_other
    if saved.unpack_hook is not None:
        return False
    other = saved.data
    return isinstance(other, torch.Tensor) and other.numel() == 1 and other.data_ptr() == ptr


def _outputs(node: Any, trained: set[int]) -> list[ModInfo]:
    """The traced calls of models with parameters whose output ``node`` made (a loss module's
    output is walked through), innermost first."""
    return [c.info for c in output_calls(node) if c.info is not None and c.info.model in trained]


def _first_input(node: Any) -> Any:
    edges = node.next_functions
    return edges[0][0] if edges else None


def _chain(loss: Any, trained: set[int]) -> Loss | None:
    """From a loss function's node along its first input (the prediction) to a traced call's
    output, then past views and casts to the op that made it."""
    ops: list[str] = []
    node = _first_input(loss)
    while node is not None and len(ops) < _CHAIN:
        infos = _outputs(node, trained)
        if infos:
            out = op_name(node)
            for _ in range(4):  # a view of a layer's output (a Linear on a 3-d input)
                below = _first_input(node) if out in schema.VIEW_OPS else None
                if below is None:
                    break
                node, out = below, op_name(below)
            inner = next(i for i in infos if i.model == infos[-1].model)
            return Loss(op_name(loss), tuple(ops), out, infos[-1], inner)
        ops.append(op_name(node))
        node = _first_input(node)
    return None


def walk(root: Any, trained: set[int], scale_ptr: int | None) -> GraphWalk:
    """Breadth first from ``root``, stopping at traced calls' outputs and at leaves. Scale
    multiplications are counted along paths of arithmetic from the root only (a gradient
    penalty's double-backward graph multiplies by the scale too, below the ops it takes)."""
    scaled = scale_ptr is not None
    depth: dict[Any, int | None] = {root: int(scaled and is_scale(root, scale_ptr or 0))}
    queue = deque([root])
    losses: list[Loss] = []
    models: set[int] = set()
    visited = 0
    while queue and visited < _BUDGET:
        node = queue.popleft()
        visited += 1
        infos = _outputs(node, trained)
        if infos:
            models.update(info.model for info in infos)
            continue
        op = op_name(node)
        if is_loss(op):
            found = _chain(node, trained)
            if found is not None:
                losses.append(found)
        d = depth[node]
        d = d if d is not None and op in _ARITH else None
        for child in _children(node):
            if child in depth or type(child).__name__ == "AccumulateGrad":
                continue
            depth[child] = None if d is None else d + int(scaled and is_scale(child,
                                                                               scale_ptr or 0))
            queue.append(child)
    return GraphWalk(losses, models, max(n or 0 for n in depth.values()) if scaled else -1)


def arithmetic_top(roots: list[Any]) -> set[Any]:
    """The nodes from the roots down through sums, scales, means, views: where terms meet."""
    return breadth(roots, _BUDGET, lambda node: [
        child for child in _children(node) if op_name(child) in _TOP])


# -- the traced calls behind a tensor, and a bootstrapped target ---------------------------------
def calls(t: torch.Tensor) -> tuple[tuple[int, str], ...]:
    """The traced calls whose outputs ``t`` was computed from (the first met on each path, and
    the calls around them that returned the same output)."""
    if t.grad_fn is None:
        return ()
    found: dict[tuple[int, str], None] = {}

    def below(node: Any) -> Iterable[Any]:
        infos = [c.info for c in output_calls(node) if c.info is not None]
        found.update(((i.model, i.fqn), None) for i in infos)
        return () if infos else _children(node)

    breadth([t.grad_fn], _SIDE_BUDGET, below)
    return tuple(found)


def _side(node: Any) -> tuple[set[int], set[int], str]:
    """From one input of a loss back to the first traced calls' outputs on each path: the
    models with parameters reached, those calls' seqs, the max passed before the first."""
    models: set[int] = set()
    seqs: set[int] = set()
    maxed: dict[Any, str] = {node: ""}
    through: list[str] = []

    def below(n: Any) -> Iterable[Any]:
        found = [c for c in output_calls(n) if c.info is not None and c.info.has_params]
        if found:
            models.update(c.info.model for c in found if c.info is not None)
            seqs.update(c.seq for c in found)
            through.append(maxed[n])
            return ()
        op = op_name(n)
        went = maxed[n] or (op if op in _MAXES else "")
        out = [c for c in _children(n) if type(c).__name__ != "AccumulateGrad"]
        for c in out:
            maxed.setdefault(c, went)
        return out

    breadth([node], _SIDE_BUDGET, below)
    return models, seqs, next((t for t in through if t), "")


def bootstrapped(loss: Any) -> tuple[int, str] | None:
    """The model (and the max) where the target side of ``loss`` (its second input) reaches,
    through a max, another call of a model its input side reaches; None otherwise."""
    edges = loss.next_functions
    if len(edges) < 2 or edges[0][0] is None or edges[1][0] is None:
        return None
    pred, target = _side(edges[0][0]), _side(edges[1][0])
    shared = pred[0] & target[0]
    if not shared or not target[2] or not (target[1] - pred[1]):
        return None
    return min(shared), target[2]


# -- the share of its batch a loss reads ---------------------------------------------------------
class Share(NamedTuple):
    """What one op of a loss reads: ``read`` elements of ``of`` (a 0-dim count on its device),
    ``bad`` the multiplier's values that are neither 0 nor 1 (a weight where not 0)."""

    detail: dict[str, Any]
    read: torch.Tensor
    bad: torch.Tensor
    of: int


class _Hooked(Exception):
    """A saved tensor behind an unpack hook (activation checkpointing, offloading): reading it
    would run the program's hook, so the op is not read."""


def _saved(raw: Any) -> Any:
    """A saved tensor read without unpacking it (None where it was not saved)."""
    if raw.unpack_hook is not None:
        raise _Hooked
    return raw.data


def _edges(node: Any) -> list[bool]:
    """Which inputs of ``node`` carry a gradient."""
    return [child is not None for child, _ in node.next_functions]


def _not01(t: torch.Tensor) -> torch.Tensor:
    return ((t != 0) & (t != 1)).sum()


def zero(device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=device)


def _mul(node: Any) -> Share | None:
    """``loss * mask``: the operand without gradient is the mask, broadcast to the product."""
    edges = _edges(node)
    if edges.count(True) != 1 or len(edges) != 2:
        return None
    mask = _saved(node._raw_saved_self if edges[1] else node._raw_saved_other)
    of = math.prod(node._input_metadata[0].shape)
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
    return Share({"by": "mask", "node": "Where"}, torch.count_nonzero(kept), zero(cond.device),
                 cond.numel())


def _masked_select(node: Any) -> Share | None:
    mask, loss = _saved(node._raw_saved_mask), _saved(node._raw_saved_self)
    shape = torch.broadcast_shapes(mask.shape, loss.shape)  # type: ignore[no-untyped-call]
    read = torch.count_nonzero(torch.broadcast_to(mask, shape))
    return Share({"by": "mask", "node": "MaskedSelect"}, read, zero(mask.device),
                 math.prod(shape))


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
                     zero(ix.device), of)
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
    loss = "F.cross_entropy" if below is not None and op_name(below) == "LogSoftmax" else \
        "F.nll_loss"
    return Share({"by": "ignore_index", "node": op_name(node), "loss": loss,
                  "ignore_index": int(ignore), "inside": True},
                 (target != ignore).sum(), zero(target.device), target.numel())


_READERS = {"Mul": _mul, "Where": _where, "MaskedSelect": _masked_select, "Index": _index,
            "NllLoss": _nll, "NllLoss2D": _nll}


def reads(roots: list[Any], known: set[Any]) -> list[Share]:
    """The shares read on the loss's top below ``roots``, down to the traced calls' outputs:
    a 0/1 mask over a per-element loss, a boolean index, ``masked_select``, ``torch.where``, an
    integer 0/1 index (it picks rows 0 and 1), the targets a ``cross_entropy`` computed inside a
    model's call left to ``ignore_index``. ``known``: the nodes of losses the window counted
    already (not walked below). A multiplier other than 0/1 (a class weight) is not a mask."""
    out: list[Share] = []

    def below(node: Any) -> Iterable[Any]:
        if node in known or (node not in roots and output_calls(node)):
            return ()  # counted by the window, or a model call's output: inside the model
        op = op_name(node)
        reader = _READERS.get(op)
        try:
            share = reader(node) if reader is not None else None
        except _Hooked:
            share = None
        if share is not None:
            out.append(share)
        return () if op in _NLL or op not in _THROUGH else _children(node)

    breadth(roots, _BUDGET, below)
    return out

"""Down to the line: the operation inside a finding's module where it happens, from the log's
``ops`` records (the zoomed calls, ``hooktrace/log/ops.py``). Pure: no files, no torch.

Each question follows the data through one zoomed call's slots, in the order its operations
ran: where a gradient stops (an operation whose input needs a gradient and whose output has
none: ``.detach()``, ``.data``, ``.numpy()``, one under ``torch.no_grad()``, then, failing
those, an integer result such as ``argmax``), where one turns exactly zero (a node that received
a non-zero gradient and passed back zero), the first NaN/Inf of a forward, the node whose
backward made NaN/Inf from finite gradients, and the in-place change behind autograd's
"modified by an inplace operation". A child's call that stops the gradient is looked into when
the child was zoomed too. What is found only adds to a finding: a zoomed call never makes one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from hooktrace.log.ops import Op, Ops

#: zoomed calls kept per module: the first ones (a loop's calls say the same)
KEEP = 8

_INT_DTYPES = ("int", "uint", "bool", "long")
_INPLACE_ERROR = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\], which is output (\d+) of (\w+)")


def _norm(stat: list[float] | None) -> float | None:
    return None if stat is None else stat[0]


def _integer(op: Op) -> bool:
    return bool(op.out_dtypes) and all(d.startswith(_INT_DTYPES) for d in op.out_dtypes)


def _needs(op: Op, slots: set[int]) -> bool:
    """One of its inputs among ``slots`` required a gradient."""
    return any(s in slots and g for s, g in zip(op.ins, op.in_grad, strict=False))


def _stops(op: Op) -> bool:
    """Its output has no gradient though an input needed one: a value stopped (not an integer
    result, which never has one)."""
    if op.leaves_torch or op.no_grad:
        return True
    return bool(op.outs) and not any(op.out_grad) and not _integer(op)


def _flow(record: Ops, sources: Iterable[int]) -> Iterator[tuple[Op, set[int]]]:
    """Each operation that reads a slot reached from ``sources``, with the slots reached
    before it; what it makes is reached after it."""
    reached = set(sources)
    for op in record.ops:
        if reached.intersection(op.ins):
            yield op, set(reached)
            reached.update(s for s in op.outs if s >= 0)


def _needing(record: Ops) -> list[int]:
    return [i for i, g in enumerate(record.in_grad) if g]


def stop_in(record: Ops, sources: Iterable[int] | None = None) -> Op | None:
    """The first operation on the way from ``sources`` (default: the call's inputs that needed
    a gradient) where a gradient stops; failing that, the first integer result."""
    flow = list(_flow(record, _needing(record) if sources is None else sources))
    stopped = next((op for op, reached in flow if _needs(op, reached) and _stops(op)), None)
    return stopped or next((op for op, reached in flow if _needs(op, reached) and _integer(op)),
                           None)


def zero_in(record: Ops, sources: Iterable[int] | None = None) -> Op | None:
    """The first operation on the way from ``sources`` whose node received a non-zero gradient
    and passed back exactly zero for what it read from there."""
    for op, reached in _flow(record, _needing(record) if sources is None else sources):
        received = [n for s in op.grad_out or () if (n := _norm(s)) is not None]
        back = op.grad_in or []
        if not received or not any(n > 0 for n in received) or not back:
            continue
        # the node's inputs are its tensor inputs, in order, where their counts agree
        mine = ([back[j] for j, s in enumerate(op.ins) if s in reached]
                if len(back) == len(op.ins) else [b for b in back if b is not None])
        if mine and all(b is not None and b[0] == 0 for b in mine):
            return op
    return None


def first_nonfinite(record: Ops) -> Op | None:
    """The first operation (or child call) whose output held NaN/Inf."""
    return next((op for op in record.ops if op.nonfinite), None)


def nonfinite_backward(record: Ops) -> Op | None:
    """The first node, in backward order, that received finite gradients and passed back
    NaN/Inf."""
    for op in reversed(record.ops):
        received = [n for s in op.grad_out or () if (n := _norm(s)) is not None]
        back = [n for s in op.grad_in or () if (n := _norm(s)) is not None]
        if received and all(map(math.isfinite, received)) and \
                any(not math.isfinite(n) for n in back):
            return op
    return None


def inplace_change(records: Iterable[Ops], message: str) -> tuple[Op, Op] | None:
    """For autograd's "modified by an inplace operation ... output N of NodeName": the
    operation whose output that is, and the in-place operation after it that changed it."""
    found = _INPLACE_ERROR.search(message)
    if found is None:
        return None
    shape = [int(n) for n in found.group(1).replace(" ", "").split(",") if n]
    index, node = int(found.group(2)), found.group(3)
    for record in records:
        for i, op in enumerate(record.ops):
            if (op.node or "").startswith(node) and op.child is None and index < len(op.outs) \
                    and op.out_shapes[index:index + 1] == [shape]:
                slot = op.outs[index]
                changed = next((later for later in record.ops[i + 1:]
                                if later.inplace and later.ins[:1] == [slot]), None)
                if changed is not None:
                    return op, changed
    return None


def op_where(op: Op, step: int) -> dict[str, Any]:
    """An operation as a finding's evidence holds it."""
    out: dict[str, Any] = {"op": op.text, "step": step}
    if op.site is not None:
        out["line"] = op.site
    if op.code:
        out["code"] = op.code
    if op.no_grad:
        out["no_grad"] = True
    return out


def said(op: Op, inside: str = "") -> str:
    """``.detach() (train.py:16)``, ``.mul() under torch.no_grad() (train.py:40)``;
    ``inside``: where it is, when not in the finding's module (`` in clip``)."""
    under = " under torch.no_grad()" if op.no_grad and op.child is None else ""
    return f"{op.text}{under}{inside}" + (f" ({op.site})" if op.site else "")

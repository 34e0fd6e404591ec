"""The operation and its line put into ``check``'s findings, from the log's zoomed calls of a
finding's module (``ops`` records, ``hooktrace/log/ops.py``); where it has none, the command that
records them (``rerun``). Pure: no files, no torch.

Each question follows the data through one zoomed call's slots, in the order its operations
ran: where a gradient stops (an operation whose input needs a gradient and whose output has
none: ``.detach()``, ``.data``, ``.numpy()``, one under ``torch.no_grad()``, then, failing
those, an integer result such as ``argmax``), where one turns exactly zero (a node that received
a non-zero gradient and passed back zero), the first NaN/Inf of a forward, the node whose
backward made NaN/Inf from finite gradients, and the in-place change behind autograd's
"modified by an inplace operation" (a backward error happens before any later step could zoom
in: it gets ``rerun``). A child's call that stops the gradient is looked into when the child
was zoomed too. What is found only adds to a finding: a zoomed call never makes one.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hooktrace.check.causes import CAUSES
from hooktrace.check.findings import NOTE, Finding, FindingKind
from hooktrace.log.ops import Op, Ops
from hooktrace.log.options import TraceOptions
from hooktrace.log.words import fqn_text

if TYPE_CHECKING:
    from hooktrace.check.boundary import Boundary, GradientFlow
    from hooktrace.check.collected import Collected

#: zoomed calls kept per module: the first ones (a loop's calls say the same)
KEEP = 8

_INT_DTYPES = ("int", "uint", "bool", "long")
_INPLACE_ERROR = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\], which is output (\d+) of (\w+)")


def _norms(stats: Iterable[list[float] | None] | None) -> list[float]:
    return [s[0] for s in stats or () if s is not None]


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


def _flow(record: Ops, sources: Iterable[int] | None) -> Iterator[tuple[Op, set[int]]]:
    """Each operation that reads a slot reached from ``sources`` (None: the call's inputs that
    needed a gradient), with the slots reached before it; what it makes is reached after it."""
    reached = set(sources) if sources is not None else {
        i for i, g in enumerate(record.in_grad) if g}
    for op in record.ops:
        if reached.intersection(op.ins):
            yield op, set(reached)
            reached.update(s for s in op.outs if s >= 0)


def stop_in(record: Ops, sources: Iterable[int] | None = None) -> Op | None:
    """The first operation on the way from ``sources`` (default: the call's inputs that needed
    a gradient) where a gradient stops; failing that, the first integer result."""
    flow = list(_flow(record, sources))
    stopped = next((op for op, reached in flow if _needs(op, reached) and _stops(op)), None)
    return stopped or next((op for op, reached in flow if _needs(op, reached) and _integer(op)),
                           None)


def zero_in(record: Ops, sources: Iterable[int] | None = None) -> Op | None:
    """The first operation on the way from ``sources`` whose node received a non-zero gradient
    and passed back exactly zero for what it read from there."""
    for op, reached in _flow(record, sources):
        received = _norms(op.grad_out)
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
        received, back = _norms(op.grad_out), _norms(op.grad_in)
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


def _branches(b: Boundary, record: Ops) -> list[int]:
    return [s for op in record.ops if op.child in b.branches for s in op.outs]


# the boundaries whose cause an operation inside the module answers, and what each asks of one
# of its zoomed calls
_ASK: dict[str, Callable[[Boundary, Ops], Op | None]] = {
    "lost_input": lambda b, r: stop_in(r),
    "zero_backward": lambda b, r: zero_in(r),
    "no_grad": lambda b, r: next((op for op in r.ops if op.child in b.branches and op.no_grad),
                                 None),
    "zeroed": lambda b, r: zero_in(r, _branches(b, r)),
    "zeroed_unit": lambda b, r: zero_in(r, _branches(b, r)),
    "detached_inside": lambda b, r: stop_in(r, _branches(b, r)),
}
_DEPTH = 4  # child calls looked into, one inside the other


def with_op_lines(findings: list[Finding], c: Collected, flowed: GradientFlow,
                  models: dict[str, int]) -> list[Finding]:
    """Each finding with the operation and line that the log's zoomed calls give it."""
    return [_with_op_line(f, c, flowed, models.get(f.model)) for f in findings]


def _with_op_line(f: Finding, c: Collected, flowed: GradientFlow, model: int | None) -> Finding:
    if model is None or f.severity == NOTE or f.step is None:
        return f
    records = [r for r in c.ops.get((model, f.module), []) if r.step >= f.step]
    if f.cause == FindingKind.BACKWARD_ERROR:
        return _inplace(f, c, f.step)
    asked, found = _answer(f, c, flowed, model, records)
    if found is not None:
        return _say(f, *found)
    if asked and not any(r.step == f.step for r in records):
        return replace(f, evidence={**f.evidence, "rerun": rerun(c, f.module, f.step)})
    return f


_Found = tuple[Op, int, str]  # an operation, the step of its call, the module whose call it is


def _answer(f: Finding, c: Collected, flowed: GradientFlow, model: int,
            records: list[Ops]) -> tuple[bool, _Found | None]:
    """Whether the finding's module's operations can answer it, and their answer."""
    key = (model, f.module)
    # only a step whose first NaN/Inf is this module's,
    if f.cause == FindingKind.NONFINITE_FORWARD:
        # or, where it was made in this module's own code, the child's that received it
        first = (model, str(f.evidence.get("received_by", f.module)))
        return True, _first(records, c.forward_nan.of_step, first, first_nonfinite)
    if f.cause == FindingKind.NONFINITE_BACKWARD:
        if not f.evidence.get("produced"):
            return False, None  # reached it: made elsewhere
        return True, _first(records, c.backward_nan.of_step, (key, True), nonfinite_backward)
    b = next((b for (k, cause), b in flowed.boundaries.items()
              if k == key and CAUSES[cause][0] == f.cause), None)
    if b is None or b.cause not in _ASK:
        return False, None
    for record in records:
        if record.step not in b.steps:
            continue  # a step where this boundary was not found (or not judged)
        op = _ASK[b.cause](b, record)
        if op is not None:
            return True, _inside(c, model, (op, record.step, record.fqn))
    return True, None


def _inside(c: Collected, model: int, found: _Found, depth: int = 0) -> _Found:
    """A child's call that stops the gradient: the operation inside it, where it was zoomed."""
    op, step, _ = found
    if op.child is None or op.no_grad or depth >= _DEPTH:
        return found
    for record in c.ops.get((model, op.child), []):
        if record.step >= step:
            inner = stop_in(record)
            if inner is not None:
                return _inside(c, model, (inner, record.step, record.fqn), depth + 1)
    return found


def _first(records: list[Ops], firsts: dict[int, Any], first: object,
           ask: Callable[[Ops], Op | None]) -> _Found | None:
    """The answer of the first record of a step whose first NaN/Inf is ``first``."""
    for record in records:
        if firsts.get(record.step) != first or len(record.ops) < 2:
            continue  # a layer's one function (F.linear of a Linear) says nothing new
        op = ask(record)
        if op is not None:
            return op, record.step, record.fqn
    return None


def _say(f: Finding, op: Op, step: int, module: str) -> Finding:
    """The operation into the message, after what happens (flow) or the step (NaN/Inf)."""
    where = op_where(op, step)
    if module != f.module:
        where["module"] = module
    inside = said(op, f" in {fqn_text(module)}" if module != f.module else "")
    if f.cause == FindingKind.NONFINITE_FORWARD:
        message = f"{f.message}; made by {inside}"
    elif f.cause == FindingKind.NONFINITE_BACKWARD:
        message = f"{f.message}; made by the backward of {inside}"
    else:  # after what happens at the boundary, before what it starves
        cut = f.message.find("; ")
        cut = cut if cut >= 0 else len(f.message)
        message = f"{f.message[:cut]}, at {inside}{f.message[cut:]}"
    return replace(f, evidence={**f.evidence, "op": where}, message=message)


def _inplace(f: Finding, c: Collected, step: int) -> Finding:
    """A backward error: the in-place change and the operation whose output it changed, from
    any zoomed call of the step; else the command that records them."""
    message = str(c.end.error.get("message", "")) if c.end and c.end.error else ""
    records = [r for rs in c.ops.values() for r in rs if r.step == step]
    found = inplace_change(records, message)
    if found is None:
        return replace(f, evidence={**f.evidence, "rerun": rerun(c, f.module, step)})
    made, changed = found
    return replace(f, evidence={**f.evidence, "op": op_where(changed, step),
                                "changed": op_where(made, step)},
                   message=f"{f.message}; {said(changed)} changed in place the output of "
                   f"{said(made)}, which its backward needs")


def rerun(c: Collected, module: str, step: int) -> str:
    """The command that runs the program again with ``module``'s operations (and those of the
    modules inside it) recorded, then checks it."""
    globs = ["*"] if not module else [module, f"{module}.*"]
    header = c.header
    options = TraceOptions.from_header(header)
    if options.run not in ("script", "module") or not header.argv:
        listed = ", ".join(repr(g) for g in globs)
        return f"trace it again with hooktrace.trace(..., ops=[{listed}])"
    log = Path(c.log or "hooktrace.jsonl")
    ranks = header.world_size > 1  # each rank wrote LOG.rank<N>.jsonl: the launcher again
    stem = log.stem.removesuffix(f".rank{header.rank}") if ranks else log.stem
    out = log.with_name(f"{stem}.ops{log.suffix or '.jsonl'}")
    words = ["torchrun", f"--nproc_per_node={header.world_size}", "-m"] if ranks else []
    words += ["hooktrace", "run", "-o", str(out)]
    for glob in globs:
        words += ["--ops", glob]
    for key, kept in (("include", options.include), ("exclude", options.exclude)):
        for glob in kept:
            words += [f"--{key}", glob]
    if step not in options.steps:
        words += ["--steps", str(step)]
    if options.run == "module":
        words.append("-m")
    words += header.argv
    checked = out.with_name(f"{stem}.ops.rank*{out.suffix}") if ranks else out
    return f"{shlex.join(words)}; hooktrace check {shlex.quote(str(checked))}"


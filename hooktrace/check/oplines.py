"""The operation and its line put into ``check``'s findings, where the log has the zoomed calls
of a finding's module (``ops`` records); where it has none, the command that records them.

Each kind of finding asks its question of its module's zoomed calls (``check/ops.py``), from
its step on: a gradient that stops or turns zero inside a forward (flow's boundaries), the
first NaN/Inf of a forward, a backward that made NaN/Inf, and the in-place change behind a
backward error. The answer goes into the message ("the gradient stops inside its forward, at
.detach() (train.py:16)") and the evidence (``op``: the operation, its ``line`` and ``code``).
A backward error happens before any later step could zoom in: its finding, and a finding whose
module was not zoomed, get ``rerun``, the command that runs the program again with that
module's operations recorded.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hooktrace.check import ops
from hooktrace.check.causes import CAUSES
from hooktrace.check.findings import NOTE, Finding, FindingKind
from hooktrace.log.ops import Op, Ops
from hooktrace.log.options import TraceOptions
from hooktrace.log.words import fqn_text

if TYPE_CHECKING:
    from hooktrace.check.boundary import Boundary, GradientFlow
    from hooktrace.check.collected import Collected

# the boundaries whose cause an operation inside the module answers
_ASKED = {"lost_input", "detached_inside", "no_grad", "zeroed", "zeroed_unit", "zero_backward"}
_DEPTH = 4  # child calls looked into, one inside the other


def with_op_lines(findings: list[Finding], c: Collected, flowed: GradientFlow) -> list[Finding]:
    """Each finding with the operation and line that the log's zoomed calls give it."""
    models = {c.model_name(i): i for i in c.models}
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
        return True, _first([r for r in records if c.forward_first.get(r.step) == first],
                            ops.first_nonfinite)
    if f.cause == FindingKind.NONFINITE_BACKWARD:
        if not f.evidence.get("produced"):
            return False, None  # reached it: made elsewhere
        return True, _first([r for r in records if c.backward_first.get(r.step) == (key, True)],
                            ops.nonfinite_backward)
    b = next((b for (k, cause), b in flowed.boundaries.items()
              if k == key and CAUSES[cause][0] == f.cause), None)
    if b is None or b.cause not in _ASKED:
        return False, None
    ask = _question(b)
    for record in records:
        if record.step not in b.steps:
            continue  # a step where this boundary was not found (or not judged)
        op = ask(record)
        if op is not None:
            return True, _inside(c, model, (op, record.step, record.fqn))
    return True, None


def _question(b: Boundary) -> Callable[[Ops], Op | None]:
    """What a boundary's cause asks of one of its zoomed calls."""
    def branches(record: Ops) -> list[int]:
        return [s for op in record.ops if op.child in b.branches for s in op.outs]

    if b.cause == "lost_input":
        return ops.stop_in
    if b.cause == "zero_backward":
        return ops.zero_in
    if b.cause == "no_grad":
        return lambda r: next((op for op in r.ops if op.child in b.branches and op.no_grad),
                              None)
    if b.cause in ("zeroed", "zeroed_unit"):
        return lambda r: ops.zero_in(r, branches(r))
    return lambda r: ops.stop_in(r, branches(r))


def _inside(c: Collected, model: int, found: _Found, depth: int = 0) -> _Found:
    """A child's call that stops the gradient: the operation inside it, where it was zoomed."""
    op, step, _ = found
    if op.child is None or op.no_grad or depth >= _DEPTH:
        return found
    for record in c.ops.get((model, op.child), []):
        if record.step >= step:
            inner = ops.stop_in(record)
            if inner is not None:
                return _inside(c, model, (inner, record.step, record.fqn), depth + 1)
    return found


def _first(records: list[Ops], ask: Callable[[Ops], Op | None]) -> _Found | None:
    for record in records:
        if len(record.ops) < 2:
            continue  # a layer's one function (F.linear of a Linear) says nothing new
        op = ask(record)
        if op is not None:
            return op, record.step, record.fqn
    return None


def _say(f: Finding, op: Op, step: int, module: str) -> Finding:
    """The operation into the message, after what happens (flow) or the step (NaN/Inf)."""
    where = ops.op_where(op, step)
    if module != f.module:
        where["module"] = module
    inside = ops.said(op, f" in {fqn_text(module)}" if module != f.module else "")
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
    found = ops.inplace_change(records, message)
    if found is None:
        return replace(f, evidence={**f.evidence, "rerun": rerun(c, f.module, step)})
    made, changed = found
    return replace(f, evidence={**f.evidence, "op": ops.op_where(changed, step),
                                "changed": ops.op_where(made, step)},
                   message=f"{f.message}; {ops.said(changed)} changed in place the output of "
                   f"{ops.said(made)}, which its backward needs")


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


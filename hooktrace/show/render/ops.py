"""A zoomed call's operations as text: the rows ``hooktrace show`` prints under the step's
table, the lines ``hooktrace view`` shows on hovering a node, and the small lines ``render
--ops`` writes inside a box. Standard library only."""

from __future__ import annotations

from collections.abc import Sequence

from hooktrace.log import schema
from hooktrace.log.gradstat import norms, worst
from hooktrace.log.words import columns, module_text, printable, shapes_text

MOST = 12  # operations drawn inside a box; the rest are counted


def _largest_norm(stats: Sequence[schema.GradStat | None] | None) -> str:
    """The largest of the tensors' norms, a NaN/Inf one first (not their L2 norm together,
    ``gradstat.norm``: the number these rows have always shown): ``1.2e-03``, ``nan``, ``0``,
    ``-`` where none came."""
    found = worst(norms(stats))
    if found is None:
        return "-"
    return "0" if found == 0 else f"{found:.2g}"


def flags(op: schema.Op) -> list[str]:
    """What is unusual about an operation, in words."""
    out = []
    if op.no_grad:
        out.append("under no_grad")
    if op.inplace:
        out.append("in place")
    if any(op.in_grad) and not any(op.out_grad) and not op.no_grad:
        out.append("no gradient out")
    if op.leaves_torch:
        out.append("leaves torch")
    for index, nan, inf in op.nonfinite or ():
        out.append(f"output {index}: {nan} NaN, {inf} Inf")
    if op.grad_out is not None:
        out.append(f"backward {_largest_norm(op.grad_out)} -> {_largest_norm(op.grad_in)}")
    return out


def row(op: schema.Op) -> list[str]:
    """An operation's cells: what it is, where, shapes, flags."""
    shapes = f"{shapes_text(op.in_shapes)} -> {shapes_text(op.out_shapes) or '-'}"
    return [printable(op.text), printable(op.site or "?"), shapes,
            printable("; ".join(flags(op)))]


def title(record: schema.Ops, cls: str) -> str:
    name = module_text(record.fqn)
    more = f", {record.more} more not recorded" if record.more else ""
    return (f"{name} ({printable(cls)}) call {record.call} (forward seq {record.fwd}): "
            f"{len(record.ops)} operations{more}")


def block(records: Sequence[schema.Ops], classes: dict[tuple[int, str], str]) -> list[str]:
    """``hooktrace show``'s rows of the zoomed calls, aligned per call."""
    lines = ["", "operations inside the zoomed calls (--ops):"]
    for record in records:
        rows = [[str(i), *row(op)] for i, op in enumerate(record.ops)]
        lines.append("  " + title(record, classes.get((record.model, record.fqn), "?")))
        if rows:
            lines += columns(rows, "    ")
    return lines


def hover(record: schema.Ops) -> list[str]:
    """The lines of a node's hover in the view page."""
    out = [" ".join(filter(None, [op.text, f"({op.site})" if op.site else "",
                                  f"{shapes_text(op.out_shapes)}",
                                  "; ".join(flags(op))])) for op in record.ops]
    if record.more:
        out.append(f"{record.more} more not recorded")
    return out


def short(op: schema.Op) -> str:
    """One line inside a drawn box: the operation, its line, what is unusual."""
    line = f":{op.line}" if op.line is not None else ""
    said = [f for f in flags(op) if not f.startswith("backward")]
    return f"{op.text}{line}" + (f" · {said[0]}" if said else "")


def inside_box(record: schema.Ops) -> list[str]:
    """The lines ``render --ops`` draws inside a box (plain text; the renderer escapes)."""
    lines = [short(op) for op in record.ops[:MOST]]
    hidden = len(record.ops) - len(lines) + record.more
    if hidden:
        lines.append(f"+{hidden} more operations")
    return lines

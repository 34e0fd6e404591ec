"""``hooktrace show --edges``: the edges of a step's picture as text, one per line.

The same ``View`` that ``render`` draws (``hooktrace.show.graph.build``): forward edges from the
call that made a tensor to each call that used it, in execution order; backward edges, the
gradient back along them in the order autograd ran them, with the norm of the gradient reaching
the call. Plain ASCII apart from the names, as the event table.
"""

from __future__ import annotations

import os

from hooktrace.log.words import module_text, plural, printable
from hooktrace.show.graph import build
from hooktrace.show.picture import Edge, NodeKey, View
from hooktrace.show.render.dot import backward_text, order_text
from hooktrace.show.render.text import Shown
from hooktrace.show.steplog import load_step

_HEADINGS = {
    (True, "forward"): "forward: from the call that made a tensor to each call that used it, "
                       "in execution order",
    (True, "backward"): "backward: the gradient back along them, in the order autograd ran; "
                        "|g|: the norm of the gradient reaching the call",
    (False, "forward"): "forward: calls in execution order (the log has no data flow: an older "
                        "hooktrace wrote it)",
    (False, "backward"): "backward: in the order it ran; |g|: the norm of the gradient "
                         "reaching the call",
}


def node_text(view: View, key: NodeKey) -> str:
    """A node as the table names it: ``layer1.0.relu (call 2/2)``, ``cell (x20)``, the model's
    name first where the step ran several."""
    model, fqn, call = key
    node = view.node_map[key]
    name = module_text(fqn)
    if len({k[0] for k in view.node_map}) > 1:
        name = f"{printable(view.log.models.get(model, str(model)))}:{name}"
    if node.module_calls > 1:
        name += f" (call {call + 1}/{node.module_calls})" if call >= 0 else \
            f" (x{node.module_calls})"
    return name


def _more(edge: Edge) -> str:
    if edge.phase == "forward":
        return ""
    return backward_text(edge.grad_norm, edge.grad_input_len, edge.grad_output_len, ", ")


def edges_table(view: View, limit: int = 0) -> str:
    """The edges of ``view``, forward then backward; ``limit`` 0: every edge."""
    names = view.log.names({key[0] for key in view.node_map})
    edges = view.edges()
    forward = sum(e.phase == "forward" for e in edges)
    depth = f"depth {view.depth} of {view.deepest}{' (auto)' if view.auto_depth else ''}"
    lines = [f"{view.log.heading()}{names or 'no forward call'}: {depth}: "
             f"{plural(forward, 'forward edge')}, "
             f"{plural(len(edges) - forward, 'backward edge')}"]
    shown = edges if limit <= 0 else edges[:limit]
    for phase in ("forward", "backward"):
        rows = [e for e in shown if e.phase == phase]
        if not rows:
            continue
        width = max(len(order_text(e, "..", "x")) for e in rows)
        lines += ["", _HEADINGS[view.dataflow, phase]]
        for e in rows:
            more = _more(e)
            lines.append(f"  {order_text(e, '..', 'x').rjust(width)}  {node_text(view, e.src)} -> "
                         f"{node_text(view, e.dst)}{'  ' + more if more else ''}")
    if len(shown) < len(edges):
        lines += ["", f"... {plural(len(edges) - len(shown), 'more edge')}: --limit 0 shows "
                      "all; --depth, --phase, --model and --step narrow the view"]
    return "\n".join(lines) + "\n"


def show_edges(log: str | os.PathLike[str], step: int | None = None, phase: str = "both",
               model: str | None = None, depth: int | None = None, limit: int = 0) -> Shown:
    """``hooktrace show --edges``: the edges of one step of the log at ``log``."""
    loaded = load_step(log, step, model)
    return Shown(edges_table(build(loaded, depth, phase), limit), loaded.warnings)

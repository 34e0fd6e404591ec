"""The text view (``hooktrace show``): a step's events as an indented table, or (``--edges``)
the edges of the step's picture, the same ``View`` that ``render`` draws, one per line.

Readable without Graphviz and over ssh: plain ASCII apart from the names themselves, one event
per line, indented by fqn depth. A long step is cut at ``limit`` rows with a line saying how to
see the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.options import selects
from hooktrace.log.words import ROOT, columns, module_text, plural, printable, shapes_text
from hooktrace.show.calls import depth_of
from hooktrace.show.graph import build
from hooktrace.show.picture import Edge, NodeKey, View
from hooktrace.show.render.dot import backward_text, order_text
from hooktrace.show.render.ops import block
from hooktrace.show.steplog import StepEvent, StepLog, load_step

DEFAULT_LIMIT = 100  # rows; resnet50 has 366 events per step, the MNIST net 14


def _phase(e: StepEvent) -> str:
    if isinstance(e, schema.ForwardEvent):
        flags = " no_grad" * e.no_grad + " recompute" * e.recompute
        return "forward" + flags
    return "backward" + " recompute" * e.recompute


def _row(log: StepLog, e: StepEvent, several_models: bool) -> list[str]:
    if isinstance(e, schema.ForwardEvent):
        grads = ""
        shapes = f"{shapes_text(e.input_shapes)} -> {shapes_text(e.output_shapes)}"
    else:
        grads = f"{e.grad_output_len}/{e.grad_input_len}"  # in the shapes' order
        shapes = f"{shapes_text(e.grad_output_shapes)} -> {shapes_text(e.grad_input_shapes)}"
    model = [printable(log.models.get(e.model, str(e.model)))] if several_models else []
    return [str(e.seq), _phase(e), *model, str(e.call),
            "  " * depth_of(e.fqn) + module_text(e.fqn), printable(log.cls(e.model, e.fqn)),
            grads, shapes]


def matches(fqn: str, cls: str, module: str | None) -> bool:
    """Whether the glob ``module`` names the module ``fqn`` of class ``cls`` (None: every
    module; ``(root)``: a model's root), as ``run --include`` does."""
    return module is None or selects((module,), fqn, cls) or (not fqn and module == ROOT)


def table(log: StepLog, phase: str | None = None, limit: int = DEFAULT_LIMIT,
          module: str | None = None) -> str:
    """The step's events (of one phase, or both; of the modules matching the glob ``module``, or
    all) in seq order; ``limit`` 0: every row."""
    mine = [e for e in log.events if matches(e.fqn, log.cls(e.model, e.fqn), module)]
    if module is not None and not mine:
        raise HooktraceError(f"no module matching {module!r} ran in step {log.step}; a glob "
                             "matches whole fqns or class names, e.g. 'layer4*' or 'Conv2d'")
    chosen = [e for e in mine if phase is None or e.phase == phase]
    models = {e.model for e in log.events}
    forward = sum(e.phase == "forward" for e in log.events)
    head = (f"{log.heading()}{log.names(models)}: {plural(forward, 'forward event')}, "
            f"{plural(len(log.events) - forward, 'backward event')}")
    if module is not None:
        head += f"; {plural(len(mine), 'event')} of modules matching {printable(module)!r}"
    if not chosen:
        return f"{head}\nno {phase} events in step {log.step}\n"
    several = len(models) > 1
    title = ["seq", "phase", *(["model"] if several else []), "call", "fqn", "class",
             "grads out/in", "shapes"]
    shown = chosen if limit <= 0 else chosen[:limit]
    lines = [head, "", *columns([title, *(_row(log, e, several) for e in shown)])]
    if len(shown) < len(chosen):
        lines.append(f"... {plural(len(chosen) - len(shown), 'more event')}: --limit 0 shows all; "
                     "--phase, --model and --step narrow the view")
    lines += ["", "shapes: forward input -> output; backward grad_output -> grad_input "
              "(- where no gradient flowed)"]
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class Shown:
    text: str
    warnings: list[str] = field(default_factory=list)


def show(log: str | os.PathLike[str], step: int | None = None, phase: str | None = None,
         model: str | None = None, limit: int = DEFAULT_LIMIT, module: str | None = None
         ) -> Shown:
    """``hooktrace show``: the table of one step of the log at ``log`` (of the modules matching
    the glob ``module``, or all)."""
    loaded = load_step(log, step, model)
    text = table(loaded, phase, limit, module)
    records = sorted((r for (m, fqn, _), r in loaded.ops.items()
                      if matches(fqn, loaded.cls(m, fqn), module)),
                     key=lambda r: (r.fwd < 0, r.fwd)) if phase != "backward" else []
    if records:
        text += "\n".join(block(records, loaded.classes)) + "\n"
    return Shown(text, loaded.warnings)


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

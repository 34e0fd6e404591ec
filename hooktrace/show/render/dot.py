"""A ``View`` as DOT text, and the Graphviz ``dot`` program for svg/png/pdf.

The only module that imports ``graphviz`` (the Python package builds the DOT source; the ``dot``
program lays it out), and only when a picture is made. Output is deterministic: nodes and
clusters are written in forward order (``seq``), edges by phase and number, and node ids come
from the model index, the fqn and the call index, never ``id()``.

Every name is text from the user's model: labels are HTML-like labels built here with every
``&``, ``<`` and ``>`` escaped and control characters written as escapes; node and cluster ids
are percent-encoded (``"``, ``\\``, ``:`` and newlines cannot end up in them).
"""

from __future__ import annotations

import html
import math
import shutil
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from hooktrace.check.findings import Finding, Thresholds
from hooktrace.log.errors import HooktraceError
from hooktrace.log.gradstat import norm
from hooktrace.log.words import plural, printable, shapes_text
from hooktrace.show.marks import Box
from hooktrace.show.output import MARK
from hooktrace.show.picture import Cluster, Edge, Node, NodeKey, View
from hooktrace.show.render.ops import inside_box

FORWARD_COLOUR = "#303030"
BACKWARD_COLOUR = "#1f63c6"
# node state -> (fill colour, what the legend says); gradient health adds its states here
VANISHING, EXPLODING = Thresholds().vanishing, Thresholds().exploding  # the same as check's
STATES = {
    "ok": ("#ffffff", ""),
    "no backward": ("#c4c4c4", "ran forward with gradients on, got no backward"),
    "no_grad": ("#e2eaf5", "ran under no_grad: no backward expected"),
    "backward later": ("#fff1cc", "got its backward in a later step (a GAN's generator)"),
    "nan/inf output": ("#f08080", "an output held NaN/Inf"),
    "nan/inf gradient": ("#f9d0d0", "a gradient held NaN/Inf (its outputs were finite)"),
    "vanishing": ("#d9d2ef", f"grad_output norm below {VANISHING:g}"),
    "exploding": ("#ffd0a0", f"grad_output norm above {EXPLODING:g}"),
}
PROBLEM_COLOUR = "#c00000"  # the outline of a box where check finds a problem
TIMES = "\N{MULTIPLICATION SIGN}"  # shapes read 8x3x224x224 with it
_CLUSTER_FILLS = ("#f7f7f7", "#eeeeee")
_FONT = "Helvetica"
_SMALL = 9


#: where the Graphviz ``dot`` program comes from, for each package manager
INSTALL_DOT = ("apt install graphviz, dnf install graphviz, brew install graphviz or conda "
               "install -c conda-forge graphviz")


class DotMissingError(HooktraceError):
    """The Graphviz ``dot`` program is not installed."""


def dot_missing() -> str | None:
    """Why nothing can be laid out here (the ``dot`` program is not on PATH), or None."""
    if shutil.which("dot") is None:
        return f"the Graphviz program dot is not installed: {INSTALL_DOT}"
    return None


def _graphviz() -> Any:  # the graphviz module; it has no type hints
    try:
        import graphviz  # type: ignore[import-untyped]  # graphviz ships no type hints
    except ImportError:
        raise HooktraceError("the graphviz Python package is missing: "
                             "pip install graphviz") from None
    return graphviz


def node_state(node: Node, checked: bool) -> str:
    """The state a node is coloured by (a key of STATES): gradient health first (from the
    statistics in the log, when it has them), then whether a backward reached it."""
    if node.nonfinite:
        return "nan/inf output"
    if node.nonfinite_grad:
        return "nan/inf gradient"
    if not checked or node.backward is not None:
        if node.grad_norm is not None and node.grad_norm < VANISHING:
            return "vanishing"
        if node.grad_norm is not None and node.grad_norm > EXPLODING:
            return "exploding"
        return "ok"
    if node.later is not None:
        return "backward later"
    return "no_grad" if node.grad_calls == 0 else "no backward"


def node_id(key: NodeKey) -> str:
    model, fqn, call = key
    return f"m{model}/{quote(fqn, safe='._()-')}#{call if call >= 0 else '*'}"


def _cluster_id(model: int, fqn: str) -> str:
    return f"cluster_m{model}/{quote(fqn, safe='._()-')}"


def _html(text: str) -> str:
    return html.escape(printable(text), quote=False)


def _small(text: str, colour: str = "#505050") -> str:
    return f'<FONT POINT-SIZE="{_SMALL}" COLOR="{colour}">{text}</FONT>'


def _kinds(found: Sequence[Finding]) -> str:
    kinds = sorted({f.cause for f in found})
    return f'<FONT COLOR="{PROBLEM_COLOUR}"><B>{_html(" · ".join(kinds))}</B></FONT>'


def node_label(node: Node, view: View, found: Sequence[Finding] = ()) -> str:
    """fqn, class (and which call), output shapes, folded calls, what backward did, and the
    kinds of the problems check finds there."""
    model, fqn, call = node.key
    name = _html(fqn) if fqn else _html(view.log.models.get(model, f"model {model}"))
    kind = _html(node.cls)
    if node.module_calls > 1 and call >= 0:
        kind += f" · call {call + 1}/{node.module_calls}"
    elif node.module_calls > 1:  # its calls folded into one node
        kind += f" {TIMES}{node.module_calls}"
    lines = [f"<B>{name}</B>", kind]
    if node.output_shapes:
        lines.append(_small(_html(shapes_text(node.output_shapes, TIMES))))
    if node.folded:
        lines.append(_small(f"+{plural(node.folded, 'call')} inside"))
    state = node_state(node, view.checked)
    if state == "backward later":
        lines.append(_small(f"<I>backward in step {node.later}</I>", "#303030"))
    elif state != "ok":
        lines.append(_small(f"<I>{state}</I>", "#303030"))
    elif view.checked and node.missing:
        lines.append(_small(f"<I>{node.missing} of {node.grad_calls} calls got no backward</I>"))
    if node.recomputed:
        lines.append(_small("<I>recomputed in backward</I>"))
    if view.ops and (record := view.log.ops.get(node.key)) is not None:
        lines += [_small(_html(line)) for line in inside_box(record)]
    if found:
        lines.append(_kinds(found))
    return "<" + "<BR/>".join(lines) + ">"


def cluster_label(cluster: Cluster, view: View, found: Sequence[Finding] = ()) -> str:
    model, fqn = cluster.key
    name = _html(fqn) if fqn else _html(view.log.models.get(model, f"model {model}"))
    parts = [f"<B>{name}</B>", _html(cluster.cls)]
    if cluster.calls > 1:
        parts.append(f"{cluster.calls} calls")
    if cluster.output_shapes:
        parts.append(_html(shapes_text(cluster.output_shapes, TIMES)))
    if cluster.missing:
        parts.append("<I>no backward</I>")
    if found:
        parts.append(_kinds(found))
    record = view.log.ops.get((model, fqn, 0)) if view.ops and cluster.calls == 1 else None
    ops = "".join(f"<BR/>{_small(_html(line))}" for line in inside_box(record)) if record else ""
    return "<" + " · ".join(parts) + ops + ">"


def norm_text(norm: float) -> str:
    """A gradient norm in 2 significant digits, short: ``3.2e-2``, ``1.0e0``, ``0``, ``NaN``."""
    if math.isnan(norm):
        return "NaN"
    if math.isinf(norm):
        return "Inf"
    if norm == 0:
        return "0"
    mantissa, exponent = f"{norm:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def backward_text(grad_norm: float | None, grad_input_len: int, grad_output_len: int,
                  sep: str = " · ") -> str:
    """What a backward edge says besides its number: the size of the gradient that reached the
    call (``|g| 3.2e-2``, from the statistics) and its tensor counts where they are not 1/1."""
    parts = [] if grad_norm is None else [f"|g| {norm_text(grad_norm)}"]
    if (grad_input_len, grad_output_len) != (1, 1):
        parts.append(f"gi {grad_input_len} go {grad_output_len}")
    return sep.join(parts)


def order_text(edge: Edge, dots: str = "\N{HORIZONTAL ELLIPSIS}", times: str = TIMES) -> str:
    """An edge's number in its phase: ``3``; for an edge run several times (between folded
    calls), its first and last and how often: ``3…2996 x999`` (with TIMES)."""
    if edge.runs == 1:
        return str(edge.order)
    return f"{edge.order}{dots}{edge.last} {times}{edge.runs}"


def _edge(edge: Edge, view: View) -> tuple[str, str, dict[str, str]]:
    """(tail id, head id, attributes). A backward edge that goes back up the forward order is
    written head first with ``dir=back``: dot then lays it beside the forward edge it mirrors,
    labels apart, and it keeps the ranks forward gave."""
    src, dst = node_id(edge.src), node_id(edge.dst)
    if edge.phase == "forward":
        return src, dst, {"label": order_text(edge), "color": FORWARD_COLOUR}
    more = backward_text(edge.grad_norm, edge.grad_input_len, edge.grad_output_len)
    attrs = {
        "label": f"{order_text(edge)} · {more}" if more else order_text(edge),
        "style": "dashed", "color": BACKWARD_COLOUR, "fontcolor": BACKWARD_COLOUR,
    }
    if not edge.mirrored:
        attrs["penwidth"] = "2"
    seq = {key: view.node_map[key].seq for key in (edge.src, edge.dst)}
    if seq[edge.dst] < seq[edge.src]:
        return dst, src, {**attrs, "dir": "back"}
    return src, dst, {**attrs, "constraint": "false"}


def _legend(view: View, states: set[str], marked: bool) -> str:
    rows = []
    if view.phase != "backward":
        rows.append((f'<FONT COLOR="{FORWARD_COLOUR}">——▶ 1, 2, …</FONT>',
                     "forward: from the call that made a tensor to each call that used it, "
                     "in execution order" if view.dataflow
                     else "forward: calls in execution order"))
    if view.phase != "forward" and view.backward_starts:
        rows.append((f'<FONT COLOR="{BACKWARD_COLOUR}">- - ▶ 1, 2, …</FONT>',
                     "backward: the gradient back along them, in the order autograd ran"
                     if view.dataflow else "backward: in the order it ran"))
        backward = [(norm(e.grad_output_stats), e.grad_input_len, e.grad_output_len)
                    for _, e in view.backward_starts]
        backward += [(e.grad_norm, e.grad_input_len, e.grad_output_len)
                     for e in view.edges() if e.phase == "backward"]
        if any(n is not None for n, _, _ in backward):
            rows.append((f'<FONT COLOR="{BACKWARD_COLOUR}">|g| 3.2e-2</FONT>',
                         "norm of the gradient reaching the call (grad_output)"))
        if any((gi, go) != (1, 1) for _, gi, go in backward):
            rows.append((f'<FONT COLOR="{BACKWARD_COLOUR}">gi 2 go 1</FONT>',
                         "its grad_input / grad_output tensor counts (not 1 / 1)"))
    if any(not e.mirrored for e in view.edges()):
        rows.append((f'<FONT COLOR="{BACKWARD_COLOUR}"><B>- - ▶</B></FONT>',
                     "bold: a backward step that forward did not take the other way"))
    swatches = {}
    for state in sorted(states - {"ok"}):
        fill, text = STATES[state]
        swatches[len(rows)] = f' BGCOLOR="{fill}" BORDER="1"'
        rows.append(("", text))
    if marked:
        rows.append((f'<FONT COLOR="{PROBLEM_COLOUR}"><B>▭ kind</B></FONT>',
                     "where hooktrace check finds a problem (the boundary it names)"))
    if any(n.folded for n in view.nodes()):
        rows.append(("+N calls inside", f"calls deeper than depth {view.depth} folded in "
                     "(--depth)"))
    if any(n.key[2] < 0 and n.module_calls > 1 for n in view.nodes()):
        rows.append((f"{TIMES}N", "N calls of a module as one node, or an edge they ran N "
                     "times (--every-call: each)"))
    cells = "".join(f'<TR><TD ALIGN="LEFT"{swatches.get(i, "")}>{a}</TD>'
                    f'<TD ALIGN="LEFT">{b}</TD></TR>' for i, (a, b) in enumerate(rows))
    return (f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="2">'
            f'<TR><TD ALIGN="LEFT" COLSPAN="2"><B>legend</B></TD></TR>{cells}</TABLE>>')


def _title(view: View) -> str:
    log = view.log
    names = _html(log.names({key[0] for key in view.node_map}, "model "))
    names = names or "no forward call in this step"  # only the backward of earlier calls
    phase = "forward and backward" if view.phase == "both" else f"{view.phase} only"
    depth = f"depth {view.depth} of {view.deepest}{' (auto)' if view.auto_depth else ''}"
    return f"<<B>{names}</B> · step {log.step} · {phase} · {depth}>"


def to_dot(view: View, marks: Mapping[Box, Sequence[Finding]] | None = None) -> str:
    """The DOT text of ``view``, byte for byte the same for the same view; ``marks``: the boxes
    outlined as where check finds a problem (``hooktrace.show.marks.marks``)."""
    graphviz = _graphviz()
    g = graphviz.Digraph("hooktrace", graph_attr={
        "rankdir": "TB", "newrank": "true", "fontname": _FONT, "fontsize": "11",
        "labelloc": "t", "labeljust": "l", "label": _title(view), "nodesep": "0.25",
        "ranksep": "0.3", "comment": MARK})
    g.attr("node", shape="box", style="rounded,filled", fontname=_FONT, fontsize="10",
           margin="0.1,0.04", penwidth="0.8")
    g.attr("edge", fontname=_FONT, fontsize="8", arrowsize="0.6", penwidth="0.8")
    states: set[str] = set()
    _emit(g, None, view, states, marks or {})
    if view.backward_starts:  # one point, the loss: an edge to each head it reached
        g.node("backward start", label="", shape="point", width="0.08",
               color=BACKWARD_COLOUR)
    for key, event in view.backward_starts:
        more = backward_text(norm(event.grad_output_stats), event.grad_input_len,
                             event.grad_output_len)
        g.edge("backward start", node_id(key),
               label=f"backward starts · {more}" if more else "backward starts",
               style="dashed", color=BACKWARD_COLOUR, fontcolor=BACKWARD_COLOUR)
    for edge in view.edges():
        tail, head, attrs = _edge(edge, view)
        g.edge(tail, head, **attrs)
    g.node("legend", label=_legend(view, states, bool(marks)), shape="plaintext", style="",
           fontsize="9")
    source: str = g.source
    return source


def _tooltip(view: View, cls: str) -> dict[str, str]:
    """Where the class's forward is (an SVG tooltip on hover): the file's name and line only,
    so that the DOT text does not depend on where the script was run from."""
    where = view.log.sources.get(cls)
    if where is None:
        return {}
    file, _, line = where.rpartition(":")
    return {"tooltip": f"{cls}.forward · {file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"}


_OUTLINE = {"color": PROBLEM_COLOUR, "penwidth": "2.5"}


def _emit(graph: Any, cluster: Cluster | None, view: View, states: set[str],
          marks: Mapping[Box, Sequence[Finding]]) -> None:
    """Write what is inside ``cluster`` into ``graph`` (a Digraph or subgraph), forward order."""
    for item in view.inside(cluster.key if cluster else None):
        found = marks.get(item.key, ())
        if isinstance(item, Node):
            state = node_state(item, view.checked)
            states.add(state)
            graph.node(node_id(item.key), label=node_label(item, view, found),
                       fillcolor=STATES[state][0], **_tooltip(view, item.cls),
                       **(_OUTLINE if found else {}))
            continue
        model, fqn = item.key
        fill = _CLUSTER_FILLS[fqn.count(".") % 2 if fqn else 0]
        outline = _OUTLINE if found else {"color": "#b0b0b0", "penwidth": "0.8"}
        with graph.subgraph(name=_cluster_id(model, fqn)) as sub:
            sub.attr(label=cluster_label(item, view, found), style="rounded,filled",
                     fillcolor=fill, color=outline["color"], fontsize="10", labeljust="l",
                     penwidth=outline["penwidth"], **_tooltip(view, item.cls))
            _emit(sub, item, view, states, marks)


class Laid:
    """A picture's DOT ``source``, laid out by ``dot`` on demand; a notebook shows it as SVG."""

    __slots__ = ()
    source: str

    def pipe(self, format: str = "svg") -> bytes:
        """The picture laid out by Graphviz ``dot`` as svg, png or pdf."""
        return run_dot(self.source, format)

    def svg(self) -> str:
        return self.pipe("svg").decode("utf-8")

    def _repr_svg_(self) -> str:
        return self.svg()


def run_dot(source: str, fmt: str) -> bytes:
    """Lay out ``source`` with the ``dot`` program into ``fmt`` (svg, png, pdf)."""
    graphviz = _graphviz()
    try:
        data: bytes = graphviz.pipe("dot", fmt, source.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound:
        raise DotMissingError(f"the Graphviz program dot, needed for {fmt}, is not installed: "
                              f"{INSTALL_DOT}") from None
    except graphviz.CalledProcessError as e:
        stderr = (e.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise HooktraceError(f"dot failed on the picture: {stderr[0] if stderr else e}") from None
    return data

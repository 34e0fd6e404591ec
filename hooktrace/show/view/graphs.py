"""The call graphs of a view page: one SVG per step and model choice, laid out by ``dot`` from
the ``render`` picture, and what hovering each node shows (its numbers, its findings). Each
step also carries its drawing one level deeper, gzipped, for a click on a folded block.

At first sight a step is drawn at ``render``'s depth where that drawing fits the page's pane
(``page.PANE``) at ``page.LEAST_SCALE`` of its size or more (resnet18's 14 nodes at depth 2);
else a level shallower, while that still has more than one node (resnet50's 22 nodes at depth
2 would show at 29%, their labels at 4 px: its stem, four layers and head at depth 1, a click on
a layer unfolding it), and the summary says so.
"""

from __future__ import annotations

import base64
import gzip
import re
from collections.abc import Sequence
from typing import Any

import orjson

from hooktrace.check.findings import NOTE, Finding
from hooktrace.log import schema
from hooktrace.log.words import fqn_text, plural, shapes_text
from hooktrace.show.graph import build
from hooktrace.show.marks import marks
from hooktrace.show.picture import Node, View
from hooktrace.show.render.dot import node_id, node_state, run_dot, to_dot
from hooktrace.show.render.ops import hover
from hooktrace.show.steplog import SelectionError, StepLog
from hooktrace.show.view.data import RunData
from hooktrace.show.view.page import LEAST_SCALE, PANE

MAX_UNFOLD_NODES = 400  # a deeper drawing with more nodes is left out (resnet50: 154)
#: ... or more edges: dot's layout time grows with them, not the nodes (an unrolled GRU cell's
#: 16 calls a level deeper: 50 nodes, 540 edges, 21 s a layout, against 0.2 s for its 94)
MAX_UNFOLD_EDGES = 500


def _norms(stats: list[schema.GradStat | None] | None) -> list[str]:
    return ["-" if s is None else f"{s[0]:.4g} (max |x| {s[1]:.4g}"
            + (f"; {int(s[2])} NaN, {int(s[3])} Inf)" if len(s) == 4 else ")")
            for s in stats or []]


def _tensors(shapes: Sequence[schema.Shape], dtypes: Sequence[str]) -> list[str]:
    return [f"{shapes_text([s], most=1)} {d}" for s, d in zip(shapes, dtypes, strict=False)] \
        or ["-"]


def _forward_details(e: schema.ForwardEvent) -> dict[str, Any]:
    found: dict[str, Any] = {"inputs": _tensors(e.input_shapes, e.input_dtypes),
                             "outputs": _tensors(e.output_shapes, e.output_dtypes)}
    if e.output_nonfinite:
        found["output NaN/Inf"] = [f"output {i}: {nan} NaN, {inf} Inf"
                                   for i, nan, inf in e.output_nonfinite]
    return found


def node_details(node: Node, view: View, events: dict[tuple[int, str, int], Any],
                 inside: Sequence[Finding]) -> dict[str, Any]:
    """What hovering ``node`` shows: names, where its class's forward is, shapes, dtypes,
    gradient norms, NaN/Inf, state and ``inside``, the findings that name it (or a module
    folded into it: ``marks.marks``)."""
    model, fqn, call = node.key
    name = view.log.models.get(model, str(model))
    found: dict[str, Any] = {"model": name, "fqn": fqn, "class": node.cls,
                             "state": node_state(node, view.checked)}
    source = view.log.sources.get(node.cls)
    if source is not None:
        found["forward"] = source
    if call >= 0:
        found["call"] = f"{call + 1} of {node.module_calls}"
    elif node.module_calls > 1:
        found["calls"] = f"{node.module_calls}, one node (--every-call: one each)"
    if node.folded:
        found["folded"] = f"{plural(node.folded, 'call')} inside"
    forward = events.get(node.key)
    if isinstance(forward, schema.ForwardEvent):
        found.update(_forward_details(forward))
    if node.backward is not None:
        found["grad_output norm"] = _norms(node.backward.grad_output_stats) or ["no statistics"]
        found["grad_input norm"] = _norms(node.backward.grad_input_stats) or ["no statistics"]
    if (record := view.log.ops.get(node.key)) is not None:
        found["operations"] = hover(record)
    if inside:
        found["findings"] = [f"[{f.cause}] {fqn_text(f.module)}: {f.message}" for f in inside]
    return found


def _drawing(view: View, events: dict[tuple[int, str, int], Any],
             findings: Sequence[Finding], draw: bool = True) -> dict[str, Any]:
    """The step's picture as SVG (none without ``draw``: no ``dot``) and each node's details."""
    found = marks(view, findings)
    nodes = {node_id(n.key): node_details(n, view, events, found.get(n.key, []))
             for n in view.nodes()}
    problems = {box: kept for box, inside in found.items()
                if (kept := [f for f in inside if f.severity != NOTE])}
    svg = run_dot(to_dot(view, problems), "svg").decode("utf-8") if draw else ""
    svg = svg[svg.find("<svg"):] if svg else ""  # no XML prolog, doctype or comment in HTML
    return {"svg": svg, "nodes": nodes, "depth": view.depth,
            "summary": f"{plural(len(view.node_map), 'node')} at depth {view.depth} of "
                       f"{view.deepest}"}


def _packed(drawing: dict[str, Any]) -> str:
    """``drawing`` as base64 of gzipped JSON: SVG shrinks about tenfold, and the page unpacks
    it only when a click asks for it (DecompressionStream, no library)."""
    return base64.b64encode(gzip.compress(orjson.dumps(drawing), mtime=0)).decode("ascii")


def scale(svg: str) -> float:
    """The scale at which ``svg`` (dot's, sized in points) fits the page's pane; 1 at most."""
    size = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    if size is None:
        return 1.0
    width, height = (float(v) * 4 / 3 for v in size.groups())  # CSS px
    return min(1.0, PANE[0] / width, PANE[1] / height)


def _graph(loaded: StepLog, findings: Sequence[Finding], every_call: bool = False,
           draw: bool = True) -> dict[str, Any]:
    """The step's drawing at first sight (the module docstring), and under "unfold" the one a
    level deeper (packed; absent when nothing is folded, it is too big to draw: more than
    MAX_UNFOLD_NODES nodes or MAX_UNFOLD_EDGES edges, or nothing is drawn)."""
    view = build(loaded, every_call=every_call)
    events = {(e.model, e.fqn, e.call): e for e in loaded.events
              if isinstance(e, schema.ForwardEvent) and not e.recompute}
    found = _drawing(view, events, findings, draw)
    deeper: dict[str, Any] | None = None
    while draw and view.depth > 1 and (fits := scale(found["svg"])) < LEAST_SCALE:
        shallower = build(loaded, view.depth - 1, every_call=every_call)
        if len(shallower.node_map) < 2:
            break  # one box: nothing to see
        shallower.auto_depth = True
        said = (f"; depth {view.depth} ({plural(len(view.node_map), 'node')}) would show at "
                f"{fits:.0%} of its size: click a block to unfold it")
        deeper, view = found, shallower
        found = _drawing(view, events, findings)
        found["summary"] += said
    if draw and any(n.folded for n in view.node_map.values()):
        if deeper is None:
            unfolded = build(loaded, view.depth + 1, every_call=every_call)
            if len(unfolded.node_map) <= MAX_UNFOLD_NODES and \
                    len(unfolded.edges()) <= MAX_UNFOLD_EDGES:
                deeper = _drawing(unfolded, events, findings)
        if deeper is not None:
            found["unfold"] = _packed(deeper)
    return found


def step_graphs(data: RunData, findings: Sequence[Finding], every_call: bool = False,
                draw: bool = True) -> dict[str, dict[str, Any]]:
    """``"model|step"`` (model "" for all models) -> the graph of that step (``draw`` False:
    without its picture), of the steps ``gather`` kept (``data.MAX_GRAPH_STEPS``)."""
    names = data.model_names()
    names = names if len(names) > 1 else []
    out: dict[str, dict[str, Any]] = {}
    for model in [None, *names]:
        try:
            loaded = data.step_logs(model)
        except SelectionError:  # the model ran nothing
            continue
        for step, one in loaded.items():  # those the model ran
            out[f"{model or ''}|{step}"] = _graph(one, findings, every_call, draw)
    return out

"""One step of a log as a call graph (``build``: a ``View``): its nodes, the clusters they nest in
(the fqn hierarchy) and the numbered forward and backward edges; what each means for the reader
is in docs/reading.md. Standard library only: no torch.

One node per module *call*, not per module with numbered visits: resnet's three calls of a
block's ``relu`` as three nodes keep the forward order a path that only moves on, so ``dot``
ranks the picture in execution order and each call keeps its own shapes and backward; one node
with visits is a hub whose crossing edges cannot show that only its second call got no gradient.
The call tree is rebuilt from fqns and ``seq`` (``calls.calls_of``); ``depth`` folds deeper calls
into their ancestor's node, and a module called more than ``FOLD_CALLS`` times is one node.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.gradstat import norms
from hooktrace.log.names import ancestors
from hooktrace.show.calls import Call, calls_of, depth_of
from hooktrace.show.flow import CallNodes, data_edges, has_flow, links, make_edge
from hooktrace.show.picture import Cluster, Edge, Node, NodeKey, View
from hooktrace.show.steplog import ModuleKey, StepLog

PHASES = ("forward", "backward", "both")
AUTO_MAX_NODES = 40  # resnet50: 22 nodes at depth 2, 154 at depth 3
AUTO_MAX_DENSITY = 1.5  # forward edges a node: more is a hairball (resnets, transformers: <= 1.2)
# a module called more often in one step is drawn as one node for all its calls (resnet's
# blocks call their relu 2-3 times; a module shared by a transformer's 12 layers stays 12 nodes)
FOLD_CALLS = 16


def node_key(c: Call, calls: dict[NodeKey, Call], depth: int) -> NodeKey | None:
    """The node that shows call ``c`` at ``depth``; None when ``c`` is a cluster."""
    if c.depth == depth or (c.depth < depth and c.children == 0):
        return c.key
    if c.depth < depth:
        return None
    top = ".".join(c.fqn.split(".")[:depth])
    parent = c.parent
    while parent is not None and depth_of(parent[1]) >= depth:
        if parent[1] == top:
            return parent
        parent = calls[parent].parent
    return (c.model, top, -1)


def per_module(calls: dict[NodeKey, Call]) -> Counter[ModuleKey]:
    """Each module's calls in the step."""
    return Counter((c.model, c.fqn) for c in calls.values())


def repeated(calls: dict[NodeKey, Call]) -> set[ModuleKey]:
    """The modules called more than FOLD_CALLS times in the step: one node each."""
    return {key for key, n in per_module(calls).items() if n > FOLD_CALLS}


def node_keys(calls: dict[NodeKey, Call], depth: int, fold: set[ModuleKey]
              ) -> tuple[CallNodes, CallNodes]:
    """Each call's node at ``depth`` (None: a cluster), where the calls of a module in ``fold``
    share the node ``(model, fqn, -1)``; and without that."""
    unfolded = {key: node_key(c, calls, depth) for key, c in calls.items()}
    return {key: node if node is None or (node[0], node[1]) not in fold
            else (node[0], node[1], -1) for key, node in unfolded.items()}, unfolded


def auto_depth(calls: dict[NodeKey, Call], fold: set[ModuleKey] | None = None) -> int:
    """The deepest depth whose picture has at most AUTO_MAX_NODES nodes and AUTO_MAX_DENSITY
    forward edges a node, where the edges follow the data (at least 1)."""
    deepest = max((c.depth for c in calls.values()), default=0)
    chosen = min(1, deepest)
    fold = fold or set()
    flow = has_flow(calls.values())
    for depth in range(2, deepest + 1):
        keys, unfolded = node_keys(calls, depth, fold)
        nodes = len(set(keys.values()) - {None})
        if nodes > AUTO_MAX_NODES:
            break
        if flow:
            edges = len({(k.src, k.dst) for k in links(calls, keys, unfolded)})
            if edges > AUTO_MAX_DENSITY * nodes:
                break
        chosen = depth
    return chosen


def build(log: StepLog, depth: int | None = None, phase: str = "both",
          every_call: bool = False) -> View:
    """The picture's model: ``depth`` None picks one; ``every_call`` draws each call of a
    module called many times (see the module docstring)."""
    if phase not in PHASES:
        raise HooktraceError(f"unknown phase {phase!r}; choose one of {', '.join(PHASES)}")
    calls, backward = calls_of(log)
    fold = set() if every_call else repeated(calls)
    chosen = auto_depth(calls, fold) if depth is None else depth
    keys, unfolded = node_keys(calls, chosen, fold)
    view = View(log, chosen, depth is None, max((c.depth for c in calls.values()), default=0),
                phase, log.has_backward and phase != "forward")
    _add_nodes(view, calls, keys)
    _add_clusters(view, calls)
    visits = [(keys[c.key], e) for c, e in backward]
    if has_flow(calls.values()):  # the edges follow the data (hooktrace.show.flow)
        view.dataflow = True
        view.edge_list += data_edges(calls, keys, unfolded,
                                     {(model, fqn, -1) for model, fqn in fold}, phase)
    else:  # a log from before: calls in call order
        view.edge_list += _call_order(keys, calls, visits, fold, phase)
    if phase != "forward":
        view.backward_starts = _starts(visits, view.edge_list if view.dataflow else None)
    return view


def _starts(visits: list[tuple[NodeKey | None, schema.BackwardEvent]],
            edges: list[Edge] | None) -> list[tuple[NodeKey, schema.BackwardEvent]]:
    """Where the backward pass enters the picture: each node whose gradient came along no drawn
    edge (every head a loss reaches: a segmentation model's out and aux, an actor-critic's
    policy and value), at its first backward event, in the order autograd reached them; the
    first node alone where the edges follow call order (``edges`` None)."""
    reached = {e.dst for e in edges or () if e.phase == "backward"}
    starts: dict[NodeKey, schema.BackwardEvent] = {}
    for key, event in visits:
        if key is not None and key not in reached and key not in starts:
            starts[key] = event
            if edges is None:
                break
    return list(starts.items())


def _call_order(keys: CallNodes, calls: dict[NodeKey, Call],
                visits: list[tuple[NodeKey | None, schema.BackwardEvent]], fold: set[ModuleKey],
                phase: str) -> list[Edge]:
    """The edges of a log without data flow: forward, between the nodes of consecutive calls;
    backward, between the nodes of consecutive backward events."""
    edges: list[Edge] = []
    forward = _chain([(keys[c.key], None) for c in calls.values()])
    if phase != "backward":
        edges += [make_edge(src, dst, "forward", [n for n, _ in runs])
                  for (src, dst, *_), runs in _runs(forward, fold).items()]
    if phase != "forward":
        mirrors = {(dst, src) for src, dst, _ in forward}
        for (src, dst, *_), runs in _runs(_chain(visits), fold).items():
            events = [e for _, e in runs if e is not None]
            edges.append(make_edge(src, dst, "backward", [n for n, _ in runs], events,
                                   (src, dst) in mirrors))
    return edges


_Link = tuple[NodeKey, NodeKey, schema.BackwardEvent | None]


def _chain(visits: Sequence[tuple[NodeKey | None, schema.BackwardEvent | None]]) -> list[_Link]:
    """Edges between consecutive distinct nodes of ``visits`` (None: a cluster, skipped), each
    with the event of the visit that entered its destination."""
    links: list[_Link] = []
    last: NodeKey | None = None
    for key, event in visits:
        if key is None or key == last:
            continue
        if last is not None:
            links.append((last, key, event))
        last = key
    return links


def _runs(links: list[_Link], fold: set[ModuleKey]
          ) -> dict[tuple[Any, ...], list[tuple[int, schema.BackwardEvent | None]]]:
    """The links, each with its runs (order, event) in order: a link to or from the node of
    a module's folded calls is one link however often it ran; any other is its own."""
    nodes = {(model, fqn, -1) for model, fqn in fold}
    found: dict[tuple[Any, ...], list[tuple[int, schema.BackwardEvent | None]]] = {}
    for order, (src, dst, e) in enumerate(links, 1):
        key = (src, dst) if src in nodes or dst in nodes else (src, dst, order)
        found.setdefault(key, []).append((order, e))
    return found


def _add_nodes(view: View, calls: dict[NodeKey, Call], keys: CallNodes) -> None:
    members: dict[NodeKey, list[Call]] = {}
    counts = per_module(calls)
    for c in calls.values():
        key = keys[c.key]
        if key is not None:
            members.setdefault(key, []).append(c)
    for key, group in members.items():
        own = calls.get(key)
        with_backward = [c.backward for c in group if c.backward is not None]
        first = min(with_backward, key=lambda e: e.seq, default=None)
        node = Node(
            key, own.cls if own else view.log.cls(key[0], key[1]), min(c.seq for c in group),
            own.output_shapes if own else _shared_shapes(key, group),
            counts[key[0], key[1]],
            folded=sum((c.model, c.fqn) != key[:2] for c in group),
            grad_calls=sum(not c.no_grad for c in group),
            missing=sum(not c.no_grad and c.backward is None and c.later is None for c in group),
            backward=own.backward if own and own.backward else first,
            later=min((c.later for c in group if c.later is not None), default=None),
            nonfinite=any(c.nonfinite for c in group),
            nonfinite_grad=any(_nonfinite_grads(c.backward) for c in group),
            grad_norm=max((n for c in group if (n := _largest_norm(c.backward)) is not None),
                          default=None),
            recomputed=any(c.recomputed for c in group))
        view.node_map[key] = node


def _shared_shapes(key: NodeKey, group: list[Call]) -> Sequence[schema.Shape]:
    """The output shapes of the node of a module's folded calls: those of every call, where
    they are the same ([] otherwise, and for a node with no call of its own module)."""
    shapes = [c.output_shapes for c in group if (c.model, c.fqn) == key[:2]]
    return shapes[0] if shapes and all(s == shapes[0] for s in shapes) else []


def _nonfinite_grads(e: schema.BackwardEvent | None) -> bool:
    """A gradient reaching the call or passed back by it is NaN/Inf."""
    return e is not None and not all(map(math.isfinite, [
        *norms(e.grad_output_stats), *norms(e.grad_input_stats)]))


def _largest_norm(e: schema.BackwardEvent | None) -> float | None:
    """The largest of a call's grad_output tensors' norms (not their L2 norm together: what
    the picture's vanishing/exploding colours have always judged); None where one is not finite
    (the box says NaN/Inf otherwise) or no statistics came."""
    found = norms(e.grad_output_stats) if e else []
    return max(found) if found and all(math.isfinite(n) for n in found) else None


def _add_clusters(view: View, calls: dict[NodeKey, Call]) -> None:
    """Put every node in the tree, under the cluster of its module or of the nearest one above."""
    clusters = view.clusters
    for node in view.nodes():
        model, fqn, _ = node.key
        for above in ancestors(fqn):
            if (model, above) not in clusters:
                clusters[(model, above)] = Cluster(
                    (model, above), view.log.cls(model, above), node.seq, 0, [], False)
    for c in calls.values():
        if (c.model, c.fqn) in clusters:
            cluster = clusters[(c.model, c.fqn)]
            cluster.calls += 1
            cluster.output_shapes = c.output_shapes if cluster.calls == 1 else []
            cluster.missing |= (view.checked and not c.no_grad and c.backward is None
                                and c.later is None)
    inside = view.contents
    for model, fqn in clusters:
        inside.setdefault((model, ancestors(fqn)[-1]) if fqn else None, []).append((model, fqn))
    for node in view.nodes():
        model, fqn, _ = node.key
        parent = (model, fqn) if (model, fqn) in clusters else \
            (model, ancestors(fqn)[-1]) if fqn else None
        inside.setdefault(parent, []).append(node.key)

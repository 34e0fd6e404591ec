"""What to draw for one step (a ``View``): its nodes, the clusters they nest in, and the numbered
forward and backward edges between them; ``graph.build`` makes it, the renderers draw it.
Standard library only (``View.graph`` gives networkx graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hooktrace.log import schema
from hooktrace.show.steplog import ModuleKey, StepLog

NodeKey = tuple[int, str, int]  # (model, fqn, call); call -1: folded calls, no own call


@dataclass(slots=True)
class Node:
    """A box in the picture: one call, or the calls folded into one call at the depth limit."""

    key: NodeKey
    cls: str
    seq: int  # the first forward seq among its calls: the order nodes are written in
    output_shapes: Sequence[schema.Shape]
    module_calls: int  # calls of this module in the step, for "call 2/3"
    folded: int = 0  # calls below it folded into this node
    grad_calls: int = 0  # its calls (own and folded) that ran with gradient recording on
    missing: int = 0  # ... of which got no backward event, in this step or a later one
    backward: schema.BackwardEvent | None = None
    later: int | None = None  # the step its backward ran in, when a later one
    nonfinite: bool = False  # an output of its calls held NaN/Inf
    nonfinite_grad: bool = False  # a gradient of its calls held NaN/Inf
    grad_norm: float | None = None  # the largest grad_output norm of its calls (statistics)
    recomputed: bool = False


@dataclass(slots=True)
class Cluster:
    """A box around the nodes of one module's descendants."""

    key: ModuleKey
    cls: str
    seq: int
    calls: int
    output_shapes: Sequence[schema.Shape]  # of its only call; [] when called 0 or several times
    missing: bool  # a call of it ran with gradient on and got no backward event


@dataclass(frozen=True, slots=True)
class Edge:
    src: NodeKey
    dst: NodeKey
    phase: str
    order: int  # 1..n in the order the phase ran (the first, for an edge run several times)
    grad_input_len: int = 0  # backward: of dst's backward event as it started
    grad_output_len: int = 0
    mirrored: bool = True  # backward: forward ran the same edge the other way
    grad_norm: float | None = None  # backward: norm of dst's grad_output (None: no statistics)
    runs: int = 1  # times the phase ran it: an edge between folded calls' nodes repeats
    last: int = 0  # the order of its last run, where it ran several times


@dataclass(slots=True)
class View:
    """What to draw for one step: nodes and edges, and the clusters they nest in."""

    log: StepLog
    depth: int
    auto_depth: bool
    deepest: int  # the depth of the deepest call: --depth beyond it changes nothing
    phase: str
    checked: bool  # the step had a backward and it is drawn: a node without one is marked
    dataflow: bool = False  # edges follow the data (``hooktrace.show.flow``), not call order
    # where the backward pass enters the picture: each head the loss reached, in order
    backward_starts: list[tuple[NodeKey, schema.BackwardEvent]] = field(default_factory=list)
    node_map: dict[NodeKey, Node] = field(default_factory=dict)
    edge_list: list[Edge] = field(default_factory=list)
    clusters: dict[ModuleKey, Cluster] = field(default_factory=dict)
    # containment: a cluster (None: the top) -> the clusters and nodes directly inside it
    contents: dict[ModuleKey | None, list[ModuleKey | NodeKey]] = field(default_factory=dict)
    ops: bool = False  # draw the operations of zoomed calls inside their boxes (render --ops)

    def nodes(self) -> list[Node]:
        return sorted(self.node_map.values(), key=lambda n: (n.seq, n.key))

    def edges(self) -> list[Edge]:
        return sorted(self.edge_list, key=lambda e: (e.phase != "forward", e.order))

    def inside(self, cluster: ModuleKey | None) -> list[Cluster | Node]:
        """The clusters and nodes directly inside ``cluster`` (None: the top), in forward order."""
        found: list[Cluster | Node] = [
            self.clusters[k] if len(k) == 2 else self.node_map[k]
            for k in self.contents.get(cluster, [])]
        return sorted(found, key=lambda x: (x.seq, x.key))

    @property
    def graph(self) -> Any:
        """The nodes (attribute "node") and edges (attribute "edge") as a networkx
        MultiDiGraph, for graph algorithms; drawing does not need it (nor its import time)."""
        import networkx as nx  # type: ignore[import-untyped]  # networkx ships no type hints

        graph = nx.MultiDiGraph()
        graph.add_nodes_from((key, {"node": node}) for key, node in self.node_map.items())
        for e in self.edge_list:
            graph.add_edge(e.src, e.dst, key=(e.phase, e.order), edge=e)
        return graph

    @property
    def tree(self) -> Any:
        """The containment as a networkx DiGraph: cluster (attribute "cluster") -> the clusters
        and nodes (attribute "node") directly inside it."""
        import networkx as nx

        tree = nx.DiGraph()
        tree.add_nodes_from((key, {"cluster": c}) for key, c in self.clusters.items())
        tree.add_nodes_from((key, {"node": node}) for key, node in self.node_map.items())
        tree.add_edges_from((parent, key) for parent, inside in self.contents.items()
                            if parent is not None for key in inside)
        return tree

"""``render``'s DOT text for every checked-in log, read back as a graph: the same text each time,
one node per call of the drawn step (checked against the log's own events), clusters nested by
fqn, forward edges numbered in execution order, backward edges dashed and numbered, going back
along the forward ones, and the backward pass starting where the log's first backward event is."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.show.render import Picture, picture, write_picture
from unit.logs import LOGS
from unit.show.dotparse import Dot, parse

ALL = sorted(p.stem for p in LOGS.glob("*.jsonl"))
DRAWN = [name for name in ALL if name != "crash"]  # crash.jsonl has no events
EXTRA = {"legend", "backward start"}  # the DOT nodes that are not calls
FORWARD_COLOUR, BACKWARD_COLOUR = "#303030", "#1f63c6"

Event = schema.ForwardEvent | schema.BackwardEvent


@cache
def events(name: str, step: int) -> list[Event]:
    """The log's events of ``step``, in seq order, read with the log's reader."""
    found = [r for r in LogReader(LOGS / f"{name}.jsonl")
             if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent)) and r.step == step]
    return sorted(found, key=lambda e: e.seq)


def forwards(name: str, step: int) -> list[schema.ForwardEvent]:
    return [e for e in events(name, step)
            if isinstance(e, schema.ForwardEvent) and not e.recompute]


def ancestors(fqn: str) -> list[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b"]``; the root has none."""
    if not fqn:
        return []
    parts = fqn.split(".")
    return ["", *(".".join(parts[:i]) for i in range(1, len(parts)))]


@cache
def drawn(name: str) -> tuple[Picture, Dot]:
    pic = picture(LOGS / f"{name}.jsonl")
    return pic, parse(pic.source)


def call_nodes(dot: Dot) -> set[str]:
    return set(dot.nodes) - EXTRA


def seqs(name: str, step: int) -> dict[str, int]:
    """Node id -> the forward seq of its call."""
    return {f"m{e.model}/{e.fqn}#{e.call}": e.seq for e in forwards(name, step)}


def forward_edges(dot: Dot) -> list[tuple[str, str, str]]:
    return [(e.tail, e.head, e.attrs["label"]) for e in dot.edges
            if e.attrs.get("style") != "dashed"]


def backward_edges(dot: Dot) -> list[tuple[str, str, dict[str, str]]]:
    return [(e.tail, e.head, e.attrs) for e in dot.edges
            if e.attrs.get("style") == "dashed" and e.tail != "backward start"]


def test_every_log_is_here() -> None:
    """The parametrised tests below run over the logs ``logs/make.py`` writes."""
    assert len(DRAWN) == 21
    assert {"mnist", "vae", "gan", "detached", "long_run", "diff_a", "diff_nostats"} <= set(DRAWN)


@pytest.mark.parametrize("name", DRAWN)
def test_dot_is_deterministic(name: str, tmp_path: Path) -> None:
    first, second = picture(LOGS / f"{name}.jsonl"), picture(LOGS / f"{name}.jsonl")
    assert first.source == second.source
    written = write_picture(LOGS / f"{name}.jsonl", tmp_path / "out.dot")
    assert written.format == "dot"
    assert (tmp_path / "out.dot").read_bytes() == first.source.encode("utf-8")


@pytest.mark.parametrize("name", DRAWN)
def test_parses_as_a_digraph_with_its_counts(name: str) -> None:
    pic, dot = drawn(name)
    assert dot.directed and dot.name == "hooktrace"
    assert f"· step {pic.step} ·" in dot.attrs["label"]
    assert len(call_nodes(dot)) == pic.nodes
    assert len(forward_edges(dot)) == pic.forward_edges
    assert len(backward_edges(dot)) == pic.backward_edges
    assert dot.nodes["legend"]["shape"] == "plaintext"


@pytest.mark.parametrize("name", DRAWN)
def test_one_node_per_call(name: str) -> None:
    """At the depth chosen (the deepest, for logs this small) every call without calls inside
    it is one node, named by model, fqn and call; nothing else is a node."""
    pic, dot = drawn(name)
    assert f"depth {pic.depth} of {pic.depth} (auto)" in dot.attrs["label"]
    called = forwards(name, pic.step)
    with_children = {(e.model, a) for e in called for a in ancestors(e.fqn)}
    leaves = {f"m{e.model}/{e.fqn}#{e.call}" for e in called
              if (e.model, e.fqn) not in with_children}
    assert call_nodes(dot) == leaves
    for node in leaves:
        assert dot.nodes[node]["label"].startswith("<<B>")


@pytest.mark.parametrize("name", DRAWN)
def test_node_labels_show_the_output_shapes(name: str) -> None:
    pic, dot = drawn(name)
    for e in forwards(name, pic.step):
        node = f"m{e.model}/{e.fqn}#{e.call}"
        if node in dot.nodes and e.output_shapes and all(e.output_shapes):
            first = "\N{MULTIPLICATION SIGN}".join(map(str, e.output_shapes[0]))
            assert first in dot.nodes[node]["label"], node


@pytest.mark.parametrize("name", DRAWN)
def test_clusters_nest_by_module_hierarchy(name: str) -> None:
    pic, dot = drawn(name)
    called = forwards(name, pic.step)
    expected = {f"cluster_m{e.model}/{a}" for e in called for a in ancestors(e.fqn)}
    assert set(dot.clusters) == expected
    for cluster in dot.clusters.values():  # a cluster sits in the one of its nearest ancestor
        model, fqn = cluster.name.removeprefix("cluster_m").split("/", 1)
        outer = ancestors(fqn)
        assert cluster.parent == (f"cluster_m{model}/{outer[-1]}" if outer else None)
    for node in call_nodes(dot):
        model, rest = node.removeprefix("m").split("/", 1)
        fqn = rest.rsplit("#", 1)[0]
        assert dot.path(node) == [f"cluster_m{model}/{a}" for a in ancestors(fqn)]


@pytest.mark.parametrize("name", DRAWN)
def test_forward_edges_numbered_in_execution_order(name: str) -> None:
    pic, dot = drawn(name)
    edges = forward_edges(dot)
    seq = seqs(name, pic.step)
    assert [label for _, _, label in edges] == [str(i) for i in range(1, len(edges) + 1)]
    for tail, head, _ in edges:
        assert seq[tail] < seq[head], (tail, head)  # from the call that made a tensor
    heads = [seq[head] for _, head, _ in edges]
    assert heads == sorted(heads)  # numbered as the calls that used them ran
    assert all(e.attrs.get("color") == FORWARD_COLOUR for e in dot.edges
               if e.attrs.get("style") != "dashed")


@pytest.mark.parametrize("name", DRAWN)
def test_backward_edges_dashed_numbered_and_mirrored(name: str) -> None:
    _, dot = drawn(name)
    edges = backward_edges(dot)
    numbers = [attrs["label"].split(" · ")[0] for _, _, attrs in edges]
    assert numbers == [str(i) for i in range(1, len(edges) + 1)]
    forward = {(tail, head) for tail, head, _ in forward_edges(dot)}
    for tail, head, attrs in edges:
        assert attrs["color"] == BACKWARD_COLOUR
        # drawn head first beside the forward edge it goes back along
        assert attrs.get("dir") == "back" and (tail, head) in forward, (tail, head)
        assert "penwidth" not in attrs  # bold: a backward step forward did not take


@pytest.mark.parametrize("name", DRAWN)
def test_backward_starts_at_the_first_backward_call(name: str) -> None:
    """... and at every other node whose gradient came along no drawn edge (each head the
    loss reached), in the order autograd reached them."""
    pic, dot = drawn(name)
    nodes = call_nodes(dot)
    reached = [f"m{e.model}/{e.fqn}#{e.call}" for e in events(name, pic.step)
               if e.phase == "backward" and f"m{e.model}/{e.fqn}#{e.call}" in nodes]
    starts = [e for e in dot.edges if e.tail == "backward start"]
    assert starts[0].head == reached[0]
    fed = {e.tail if e.attrs.get("dir") == "back" else e.head for e in dot.edges
           if e.attrs.get("color") == BACKWARD_COLOUR and e.tail != "backward start"}
    expected = [n for n in dict.fromkeys(reached) if n not in fed]
    follows_data = "from the call that made a tensor" in pic.source
    assert [e.head for e in starts] == (expected if follows_data else expected[:1])
    assert all(e.attrs["label"].startswith("backward starts") for e in starts)
    assert dot.nodes["backward start"]["shape"] == "point"

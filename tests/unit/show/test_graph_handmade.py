"""The call graph of logs written by hand with the log's writer: a log without data flow drawn in
call order, a module called more than 16 times folded into one node (and 16 times not), the
gradient-health colours at check's thresholds and just inside them, a step with no backward,
and names that need escaping in DOT's HTML labels."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hooktrace.show.render import picture
from hooktrace.show.render.text import show_edges
from unit.show.dotparse import Dot, parse
from unit.show.handlog import Builder, chain

EXTRA = {"legend", "backward start"}
NAMES = ["fc1", "act", "fc2"]


def mlp(path: Path, *, dataflow: bool, norms: list[float] | None = None,
        names: list[str] = NAMES, model: str = "net") -> Path:
    b = Builder()
    b.model(0, model, "Net", {n: "Linear" for n in names})
    chain(b, 0, names, norms, dataflow=dataflow)
    chain(b, 1, names, norms, dataflow=dataflow)
    return b.write(path, dataflow=dataflow)


def loop(path: Path, calls: int) -> Path:
    """enc, then ``cell`` ``calls`` times, each on the last one's output, then head."""
    b = Builder()
    b.model(0, "rnn", "RNN", {"enc": "Linear", "cell": "RNNCell", "head": "Linear"})
    names = ["enc", *["cell"] * calls, "head"]
    seqs: list[int] = []
    for i, name in enumerate(names):
        seqs.append(b.forward(0, name, call=names[:i].count(name),
                              inputs_from=[(seqs[-1],)] if seqs else [()]))
    root = b.forward(0, "", inputs_from=[()], made=[seqs[-1]])
    b.backward(0, "", root, grad_input=False)
    for i in reversed(range(len(names))):
        b.backward(0, names[i], seqs[i], call=names[:i].count(names[i]), grad_input=i > 0)
    b.end_step(0, len(names) + 1, len(names) + 1)
    return b.write(path, dataflow=True)


def edges(dot: Dot, dashed: bool) -> list[tuple[str, str, str]]:
    return [(e.tail, e.head, e.attrs["label"]) for e in dot.edges
            if (e.attrs.get("style") == "dashed") == dashed and e.tail != "backward start"]


# -- data flow or call order -----------------------------------------------------------------------

@pytest.mark.parametrize("dataflow", [True, False])
def test_a_chain_is_drawn_alike_with_or_without_data_flow(tmp_path: Path, dataflow: bool) -> None:
    dot = parse(picture(mlp(tmp_path / "log.jsonl", dataflow=dataflow)).source)
    assert [n for n in dot.nodes if n not in EXTRA] == ["m0/fc1#0", "m0/act#0", "m0/fc2#0"]
    assert edges(dot, dashed=False) == [("m0/fc1#0", "m0/act#0", "1"),
                                        ("m0/act#0", "m0/fc2#0", "2")]
    assert [(t, h, label.split(" · ")[0]) for t, h, label in edges(dot, dashed=True)] == [
        ("m0/act#0", "m0/fc2#0", "1"), ("m0/fc1#0", "m0/act#0", "2")]
    legend = dot.nodes["legend"]["label"]
    assert ("from the call that made a tensor" in legend) == dataflow
    assert ("forward: calls in execution order" in legend) == (not dataflow)


@pytest.mark.parametrize(("dataflow", "heading"), [
    (True, "forward: from the call that made a tensor to each call that used it"),
    (False, "forward: calls in execution order (the log has no data flow: an older hooktrace "
            "wrote it)"),
])
def test_show_edges_says_how_edges_were_found(tmp_path: Path, dataflow: bool,
                                              heading: str) -> None:
    text = show_edges(mlp(tmp_path / "log.jsonl", dataflow=dataflow)).text
    assert text.splitlines()[2].startswith(heading)
    assert "  1  fc1 -> act\n  2  act -> fc2\n" in text


def test_without_data_flow_parallel_calls_become_a_chain(tmp_path: Path) -> None:
    """Call order links consecutive calls, whatever made their inputs."""
    b = Builder()
    b.model(0, "net", "Net", {"a": "Linear", "b": "Linear"})
    first = b.forward(0, "a", inputs_from=[()])
    second = b.forward(0, "b", inputs_from=[()])  # both read the model's input
    root = b.forward(0, "", inputs_from=[()], made=[first, second])
    b.backward(0, "", root, grad_input=False)
    b.backward(0, "b", second, grad_input=False)
    b.backward(0, "a", first, grad_input=False)
    b.end_step(0, 3, 3)
    with_flow = parse(picture(b.write(tmp_path / "flow.jsonl", dataflow=True)).source)
    without = parse(picture(b.write(tmp_path / "old.jsonl", dataflow=False)).source)
    assert edges(with_flow, dashed=False) == []
    assert edges(without, dashed=False) == [("m0/a#0", "m0/b#0", "1")]


# -- a module called many times --------------------------------------------------------------------

def test_seventeen_calls_are_one_node(tmp_path: Path) -> None:
    pic = picture(loop(tmp_path / "log.jsonl", 17))
    dot = parse(pic.source)
    assert [n for n in dot.nodes if n not in EXTRA] == ["m0/enc#0", "m0/cell#*", "m0/head#0"]
    assert "RNNCell \N{MULTIPLICATION SIGN}17" in dot.nodes["m0/cell#*"]["label"]
    assert edges(dot, dashed=False) == [
        ("m0/enc#0", "m0/cell#*", "1"),
        ("m0/cell#*", "m0/cell#*", "2\N{HORIZONTAL ELLIPSIS}17 \N{MULTIPLICATION SIGN}16"),
        ("m0/cell#*", "m0/head#0", "18")]
    assert pic.nodes == 3
    assert "N calls of a module as one node" in dot.nodes["legend"]["label"]


def test_sixteen_calls_stay_sixteen_nodes(tmp_path: Path) -> None:
    pic = picture(loop(tmp_path / "log.jsonl", 16))
    dot = parse(pic.source)
    assert pic.nodes == 18 and pic.forward_edges == 17
    assert "m0/cell#*" not in dot.nodes
    assert "call 16/16" in dot.nodes["m0/cell#15"]["label"]
    assert "N calls of a module as one node" not in dot.nodes["legend"]["label"]


def test_every_call_draws_each_call(tmp_path: Path) -> None:
    path = loop(tmp_path / "log.jsonl", 20)
    pic = picture(path, every_call=True)
    dot = parse(pic.source)
    assert pic.nodes == 22 and pic.forward_edges == 21 and pic.backward_edges == 21
    assert [f"m0/cell#{i}" for i in range(20)] == \
        [n for n in dot.nodes if n.startswith("m0/cell#")]
    assert [label for _, _, label in edges(dot, dashed=False)] == [str(i) for i in range(1, 22)]


def test_show_edges_folds_as_render_does(tmp_path: Path) -> None:
    text = show_edges(loop(tmp_path / "log.jsonl", 20)).text
    assert "  2..20 x19  cell (x20) -> cell (x20)\n" in text
    assert text.splitlines()[0].endswith("3 forward edges, 3 backward edges")


# -- gradient health -------------------------------------------------------------------------------

@pytest.mark.parametrize(("norm", "fill", "state"), [
    (1e-9, "#d9d2ef", "vanishing"),
    (1e-7, "#ffffff", None),  # not below check's 1e-7
    (0.5, "#ffffff", None),
    (1e4, "#ffffff", None),  # not above check's 1e4
    (1.5e4, "#ffd0a0", "exploding"),
    (math.nan, "#f9d0d0", "nan/inf gradient"),
    (math.inf, "#f9d0d0", "nan/inf gradient"),
])
def test_grad_norm_colours(tmp_path: Path, norm: float, fill: str, state: str | None) -> None:
    path = mlp(tmp_path / "log.jsonl", dataflow=True, norms=[1.0, norm, 1.0])
    attrs = parse(picture(path, findings=False).source).nodes["m0/act#0"]
    assert attrs["fillcolor"] == fill
    assert (f"<I>{state}</I>" in attrs["label"]) if state else ("<I>" not in attrs["label"])
    others = parse(picture(path, findings=False).source).nodes["m0/fc1#0"]
    assert others["fillcolor"] == "#ffffff"


def test_nonfinite_output_is_red(tmp_path: Path) -> None:
    b = Builder()
    b.model(0, "net", "Net", {"fc1": "Linear", "fc2": "Linear"})
    first = b.forward(0, "fc1", output_nonfinite=[[0, 3, 1]])
    second = b.forward(0, "fc2")
    root = b.forward(0, "")
    b.backward(0, "", root, grad_input=False)
    b.backward(0, "fc2", second)
    b.backward(0, "fc1", first, grad_input=False)
    b.end_step(0, 3, 3)
    dot = parse(picture(b.write(tmp_path / "log.jsonl"), findings=False).source)
    assert dot.nodes["m0/fc1#0"]["fillcolor"] == "#f08080"
    assert dot.nodes["m0/fc2#0"]["fillcolor"] == "#ffffff"
    assert "an output held NaN/Inf" in dot.nodes["legend"]["label"]


def test_a_step_without_backward_draws_forward_only(tmp_path: Path) -> None:
    """Inference: calls under no_grad, no backward in the log; the step is drawn, uncoloured."""
    b = Builder()
    b.model(0, "net", "Net", {"fc1": "Linear", "fc2": "Linear"})
    b.forward(0, "fc1", no_grad=True)
    b.forward(0, "fc2", no_grad=True)
    b.forward(0, "", no_grad=True)
    pic = picture(b.write(tmp_path / "log.jsonl"))
    dot = parse(pic.source)
    assert (pic.step, pic.nodes, pic.forward_edges, pic.backward_edges) == (0, 2, 1, 0)
    assert "backward start" not in dot.nodes
    assert {dot.nodes[n]["fillcolor"] for n in ("m0/fc1#0", "m0/fc2#0")} == {"#ffffff"}


def test_a_call_without_backward_is_grey_where_the_step_had_one(tmp_path: Path) -> None:
    b = Builder()
    b.model(0, "net", "Net", {"fc1": "Linear", "aux": "Linear"})
    first = b.forward(0, "fc1")
    b.forward(0, "aux")  # gradients on, but nothing brings one back
    root = b.forward(0, "")
    b.backward(0, "", root, grad_input=False)
    b.backward(0, "fc1", first, grad_input=False)
    b.end_step(0, 3, 2)
    dot = parse(picture(b.write(tmp_path / "log.jsonl"), findings=False).source)
    assert dot.nodes["m0/aux#0"]["fillcolor"] == "#c4c4c4"
    assert "<I>no backward</I>" in dot.nodes["m0/aux#0"]["label"]
    assert dot.nodes["m0/fc1#0"]["fillcolor"] == "#ffffff"


# -- names in labels -------------------------------------------------------------------------------

def test_names_are_escaped_in_html_labels(tmp_path: Path) -> None:
    path = mlp(tmp_path / "log.jsonl", dataflow=True, model="a<b>&c")
    pic = picture(path)
    dot = parse(pic.source)  # still DOT: the name's brackets are escaped
    assert "a&lt;b&gt;&amp;c (Net)" in dot.attrs["label"]
    assert "a<b>&c" not in pic.source
    assert "<B>a&lt;b&gt;&amp;c</B>" in dot.clusters["cluster_m0/"].attrs["label"]


def test_the_same_log_written_twice_draws_the_same_text(tmp_path: Path) -> None:
    one = mlp(tmp_path / "one.jsonl", dataflow=True)
    two = mlp(tmp_path / "two.jsonl", dataflow=True)
    assert one.read_bytes() == two.read_bytes()
    assert picture(one).source == picture(two).source


# -- edges per output ------------------------------------------------------------------------------

def lstm_like(path: Path, *, per_output: bool, used: int = 0) -> Path:
    """``rnn`` returns ``(proj(out), (h, c))``: output 0 made by ``rnn.proj``, outputs 1 and 2 by
    ``rnn.lstm``; ``head`` uses output 0 (``per_output`` False: a log from before ``from_out``
    and ``made_out``, which says only that ``rnn``'s outputs came from both)."""
    b = Builder()
    b.model(0, "tagger", "Tagger", {"rnn": "Recurrent", "rnn.lstm": "LSTM",
                                    "rnn.proj": "Linear", "head": "Linear"})
    three = ((4, 8), (1, 4, 8), (1, 4, 8))
    lstm = b.forward(0, "rnn.lstm", inputs_from=[()], outs=three)
    proj = b.forward(0, "rnn.proj", inputs_from=[(lstm,)])
    more: dict[str, object] = {"made_out": [(proj,), (lstm,), (lstm,)]} if per_output else {}
    rnn = b.forward(0, "rnn", inputs_from=[()], outs=three, made=[lstm, proj], **more)
    # head used output ``used`` of rnn: from_out absent means output 0 of each producer
    head = b.forward(0, "head", inputs_from=[(rnn,)], from_out=[(used,)] if used else None)
    root = b.forward(0, "", inputs_from=[()], made=[head])
    b.backward(0, "", root, grad_input=False)
    b.backward(0, "head", head)
    b.backward(0, "rnn", rnn, grad_input=False)
    b.backward(0, "rnn.proj", proj)
    b.backward(0, "rnn.lstm", lstm, grad_input=False)
    b.end_step(0, 5, 5)
    return b.write(path, dataflow=True)


@pytest.mark.parametrize(("per_output", "drawn"), [
    (True, [("m0/rnn.lstm#0", "m0/rnn.proj#0", "1"), ("m0/rnn.proj#0", "m0/head#0", "2")]),
    # a log from before: joined to the makers of every output, as it was drawn then
    (False, [("m0/rnn.lstm#0", "m0/rnn.proj#0", "1"), ("m0/rnn.lstm#0", "m0/head#0", "2"),
             ("m0/rnn.proj#0", "m0/head#0", "3")]),
])
def test_a_consumer_of_one_output_is_joined_to_its_makers(
        tmp_path: Path, per_output: bool, drawn: list[tuple[str, str, str]]) -> None:
    dot = parse(picture(lstm_like(tmp_path / "log.jsonl", per_output=per_output)).source)
    assert edges(dot, dashed=False) == drawn


def test_from_out_names_the_output_used(tmp_path: Path) -> None:
    """A consumer of ``h`` (output 1) is joined to the LSTM, not to the projection."""
    path = lstm_like(tmp_path / "log.jsonl", per_output=True, used=1)
    assert '"from_out":[[1]]' in path.read_text()
    dot = parse(picture(path).source)
    assert edges(dot, dashed=False) == [("m0/rnn.lstm#0", "m0/rnn.proj#0", "1"),
                                        ("m0/rnn.lstm#0", "m0/head#0", "2")]

"""``render`` on the checked-in logs, option by option: what ``step``, ``model``, ``depth``,
``phase``, ``findings`` and ``ops`` change in the DOT text (and what they leave alone), the
colour of each call's state, ``write_picture``'s output names and refusals, and the thin
``hooktrace render --format dot`` command (no ``dot`` program needed)."""

from __future__ import annotations

import shutil
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooktrace.cli import cli
from hooktrace.log.errors import HooktraceError, LogError
from hooktrace.show.render import picture, render, write_picture
from hooktrace.show.steplog import SelectionError
from unit.logs import LOGS
from unit.show.dotparse import Dot, parse

EXTRA = {"legend", "backward start"}
OUTLINE = "#c00000"


def log(name: str) -> Path:
    return LOGS / f"{name}.jsonl"


def dot_of(name: str, **options: object) -> Dot:
    return parse(picture(log(name), **options).source)  # type: ignore[arg-type]


def calls(dot: Dot) -> list[str]:
    """The call nodes in the order they are written (forward order)."""
    return [n for n in dot.nodes if n not in EXTRA]


def solid(dot: Dot) -> list[tuple[str, str]]:
    return [(e.tail, e.head) for e in dot.edges if e.attrs.get("style") != "dashed"]


def dashed(dot: Dot) -> list[tuple[str, str]]:
    return [(e.tail, e.head) for e in dot.edges
            if e.attrs.get("style") == "dashed" and e.tail != "backward start"]


def outlined(dot: Dot) -> set[str]:
    """The nodes and clusters drawn with check's red outline."""
    boxes = {n for n, attrs in dot.nodes.items() if attrs.get("color") == OUTLINE}
    return boxes | {c for c, cluster in dot.clusters.items() if cluster.attrs["color"] == OUTLINE}


# -- what is drawn ---------------------------------------------------------------------------------

def test_mnist_is_a_chain_of_six_calls() -> None:
    dot = dot_of("mnist")
    chain = ["m0/conv1#0", "m0/conv2#0", "m0/dropout1#0", "m0/fc1#0", "m0/dropout2#0",
             "m0/fc2#0"]
    assert calls(dot) == chain
    assert solid(dot) == list(pairwise(chain))
    assert dashed(dot) == list(reversed(solid(dot)))  # back along the same edges, last first
    assert set(dot.clusters) == {"cluster_m0/"}
    assert "8\N{MULTIPLICATION SIGN}32\N{MULTIPLICATION SIGN}26\N{MULTIPLICATION SIGN}26" in \
        dot.nodes["m0/conv1#0"]["label"]
    assert all(dot.nodes[n]["fillcolor"] == "#ffffff" for n in chain)  # healthy: no state


def test_vae_branches_and_joins() -> None:
    """fc1 feeds both heads; they join into fc3 (docs/reading.md)."""
    dot = dot_of("vae")
    assert solid(dot) == [("m0/fc1#0", "m0/fc21#0"), ("m0/fc1#0", "m0/fc22#0"),
                          ("m0/fc21#0", "m0/fc3#0"), ("m0/fc22#0", "m0/fc3#0"),
                          ("m0/fc3#0", "m0/fc4#0")]
    labels = [e.attrs["label"] for e in dot.edges if e.attrs.get("style") == "dashed"]
    assert labels[0].startswith("backward starts · |g| ")
    assert [label.split(" · ")[0] for label in labels[1:]] == ["1", "2", "3", "4", "5"]


def test_gan_calls_of_one_module_are_nodes_of_their_own() -> None:
    dot = dot_of("gan")
    assert {"m1/0#0", "m1/0#1", "m2/#0", "m2/#1"} <= set(dot.nodes)
    assert "call 2/2" in dot.nodes["m1/0#1"]["label"]
    assert ("m0/3#0", "m1/0#1") in solid(dot)  # through .detach(): drawn forward ...
    assert ("m0/3#0", "m1/0#1") not in dashed(dot)  # ... and no gradient back along it
    assert "2 calls" in dot.clusters["cluster_m1/"].attrs["label"]


# -- --step ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [0, 1, 2])
def test_step_draws_that_step(step: int) -> None:
    pic = picture(log("mnist"), step=step)
    assert pic.step == step
    assert f"· step {step} ·" in parse(pic.source).attrs["label"]
    assert calls(parse(pic.source)) == calls(dot_of("mnist"))  # the same net every step


def test_default_step_is_the_first_with_a_backward() -> None:
    assert picture(log("mnist")).step == 0
    assert picture(log("mnist")).source == picture(log("mnist"), step=0).source


def test_step_not_in_the_log_names_the_steps_it_has() -> None:
    with pytest.raises(SelectionError, match=r"no step 3 in .*mnist.jsonl; its steps: 0-2"):
        picture(log("mnist"), step=3)


def test_steps_differ_in_their_numbers() -> None:
    """long_run records steps 0 and 1 only; their gradients differ, their calls do not."""
    first, second = picture(log("long_run"), step=0), picture(log("long_run"), step=1)
    assert first.source != second.source
    assert calls(parse(first.source)) == calls(parse(second.source))
    with pytest.raises(SelectionError, match="its steps: 0-1"):
        picture(log("long_run"), step=50)  # a watched step: anomalies, no events


# -- --model ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "index", "nodes", "edges"), [
    ("generator", 0, 4, (3, 0)), ("discriminator", 1, 6, (4, 4)), ("criterion", 2, 2, (0, 0))])
def test_model_draws_that_model_only(model: str, index: int, nodes: int,
                                     edges: tuple[int, int]) -> None:
    pic = picture(log("gan"), model=model, step=0)
    dot = parse(pic.source)
    assert {n.split("/")[0] for n in calls(dot)} == {f"m{index}"}
    assert (pic.nodes, (pic.forward_edges, pic.backward_edges)) == (nodes, edges)
    assert dot.attrs["label"].startswith(f"<<B>{model} (")


def test_default_step_of_a_model_draws_its_calls() -> None:
    pic = picture(log("gan"), model="generator")
    assert pic.nodes == 4


def test_all_models_without_model() -> None:
    assert {n.split("/")[0] for n in calls(dot_of("gan"))} == {"m0", "m1", "m2"}


def test_unknown_model_names_the_models() -> None:
    with pytest.raises(SelectionError, match=r"no model 'critic' in .*; its models: 'criterion', "
                                             r"'discriminator', 'generator'"):
        picture(log("gan"), model="critic")


# -- --depth ---------------------------------------------------------------------------------------

def test_depth_one_folds_each_branch_into_a_node() -> None:
    pic = picture(log("detached"), depth=1)
    dot = parse(pic.source)
    assert calls(dot) == ["m0/branch_a#0", "m0/branch_b#0"]
    assert set(dot.clusters) == {"cluster_m0/"}
    assert all("+3 calls inside" in dot.nodes[n]["label"] for n in calls(dot))
    assert "depth 1 of 2>" in dot.attrs["label"]  # chosen, not auto
    assert (pic.depth, pic.auto_depth) == (1, False)


def test_depth_zero_is_one_node_for_the_model() -> None:
    dot = dot_of("detached", depth=0)
    assert calls(dot) == ["m0/#0"]
    assert dot.clusters == {}
    assert "+8 calls inside" in dot.nodes["m0/#0"]["label"]
    assert "4 of 9 calls got no backward" in dot.nodes["m0/#0"]["label"]


@pytest.mark.parametrize("depth", [2, 3, 10])
def test_depth_at_or_past_the_deepest_changes_nothing_but_the_title(depth: int) -> None:
    auto = picture(log("detached")).source
    chosen = picture(log("detached"), depth=depth).source
    assert chosen != auto
    assert chosen.replace(f"depth {depth} of 2>", "depth 2 of 2 (auto)>") == auto


def test_folded_finding_outlines_the_node_it_is_folded_into() -> None:
    assert outlined(dot_of("exploding")) == {"m0/layers.0#0"}
    assert outlined(dot_of("exploding", depth=1)) == {"m0/layers#0"}  # layers.0 folded in


# -- --phase ---------------------------------------------------------------------------------------

def test_phase_forward_draws_no_backward() -> None:
    both, forward = dot_of("mnist"), dot_of("mnist", phase="forward")
    assert solid(forward) == solid(both)
    assert dashed(forward) == [] and "backward start" not in forward.nodes
    assert "forward only" in forward.attrs["label"]


def test_phase_backward_draws_no_forward() -> None:
    both, backward = dot_of("mnist"), dot_of("mnist", phase="backward")
    assert solid(backward) == []
    assert dashed(backward) == dashed(both)
    assert "backward start" in backward.nodes
    assert "backward only" in backward.attrs["label"]


def test_unknown_phase_is_an_error() -> None:
    with pytest.raises(HooktraceError, match="unknown phase 'sideways'"):
        picture(log("mnist"), phase="sideways")


# -- findings --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "step", "box", "kind"), [
    ("detached", 0, "cluster_m0/", "no-grad"),  # the boundary: where the gradient stops
    ("ops", 0, "cluster_m0/", "no-grad"),
    ("nan_layer", 3, "m0/compress#0", "nonfinite-forward"),
    ("diff_nan", 3, "m0/poison#0", "nonfinite-forward"),
    ("frozen", 0, "m0/layers.2#0", "frozen"),
    ("dead_relu", 0, "m0/act2#0", "dead-activation"),
    ("exploding", 0, "m0/layers.0#0", "exploding"),
    ("stale_optimizer", 0, "cluster_m0/", "not-optimized"),
    ("eval_mode", 3, "cluster_m0/", "eval-backward"),
])
def test_findings_are_outlined_with_their_kind(name: str, step: int, box: str,
                                               kind: str) -> None:
    pic = picture(log(name), step=step)
    dot = parse(pic.source)
    assert box in outlined(dot)
    attrs = dot.clusters[box].attrs if box in dot.clusters else dot.nodes[box]
    assert kind in attrs["label"] and attrs["penwidth"] == "2.5"
    assert pic.problems >= 1
    bare = picture(log(name), step=step, findings=False)
    assert outlined(parse(bare.source)) == set() and OUTLINE not in bare.source
    assert bare.problems == 0 and bare.elsewhere == []


@pytest.mark.parametrize(("name", "step"), [
    ("mnist", 0), ("vae", 0), ("diff_a", 0), ("diff_lr", 1), ("diff_nostats", 0),
    ("gan", 0),  # check's notes (a module called twice) are not problems
    ("long_run", 0),  # its NaN is at watched step 50
    ("unused", 0),  # the unused module is never called: nothing to outline
    ("nan_layer", 0), ("eval_mode", 0),  # their problems are at step 3
])
def test_nothing_outlined_where_check_finds_nothing_in_the_step(name: str, step: int) -> None:
    pic = picture(log(name), step=step)
    assert outlined(parse(pic.source)) == set()
    assert pic.problems == 0
    assert "where hooktrace check finds a problem" not in pic.source  # the legend's row


@pytest.mark.parametrize(("name", "elsewhere"), [
    ("nan_layer", [3]), ("diff_nan", [3]), ("eval_mode", [3]), ("mnist", []), ("detached", []),
    ("long_run", []),  # step 50 is not a recorded step: --step cannot draw it
])
def test_problems_in_other_steps_are_named(name: str, elsewhere: list[int]) -> None:
    assert picture(log(name)).elsewhere == elsewhere
    for step in elsewhere:
        shown = picture(log(name), step=step)
        assert shown.problems >= 1 and shown.elsewhere == []


# -- states: fill colours --------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "step", "node", "fill", "words"), [
    ("gan", 0, "m0/0#0", "#fff1cc", "backward in step 1"),
    ("gan", 0, "m1/0#0", "#ffffff", None),
    ("detached", 0, "m0/branch_b.0#0", "#c4c4c4", "no backward"),
    ("detached", 0, "m0/branch_a.0#0", "#ffffff", None),
    ("eval_mode", 3, "m0/0#0", "#e2eaf5", "no_grad"),  # the validation pass
    ("eval_mode", 3, "m0/0#1", "#ffffff", None),
    ("dead_relu", 0, "m0/fc1#0", "#d9d2ef", "vanishing"),
    ("exploding", 0, "m0/layers.0#0", "#ffd0a0", "exploding"),
    ("exploding", 0, "m0/layers.29#0", "#ffffff", None),
    ("nan_layer", 3, "m0/compress#0", "#f08080", "nan/inf output"),
    ("nan_layer", 3, "m0/fc1#0", "#f9d0d0", "nan/inf gradient"),
    ("nan_layer", 0, "m0/compress#0", "#ffffff", None),
])
def test_state_fill(name: str, step: int, node: str, fill: str, words: str | None) -> None:
    attrs = dot_of(name, step=step, findings=False).nodes[node]
    assert attrs["fillcolor"] == fill
    state = attrs["label"].split('COLOR="#303030"><I>')[1].split("<")[0] \
        if 'COLOR="#303030"><I>' in attrs["label"] else None
    assert state == words


def test_statistics_label_backward_edges_only_when_recorded() -> None:
    with_stats = [e.attrs["label"] for e in dot_of("diff_a").edges
                  if e.attrs.get("style") == "dashed"]
    without = [e.attrs["label"] for e in dot_of("diff_nostats").edges
               if e.attrs.get("style") == "dashed"]
    assert len(with_stats) == len(without) == 4
    assert all("|g| " in label for label in with_stats)
    assert not any("|g|" in label for label in without)
    assert without == ["backward starts", "1", "2", "3"]


# -- --ops -----------------------------------------------------------------------------------------

def test_ops_draws_the_zoomed_calls_operations() -> None:
    plain, ops = dot_of("ops"), dot_of("ops", ops=True)
    assert "F.linear():26" in ops.nodes["m0/branch_b.0#0"]["label"]
    assert "F.relu():26" in ops.nodes["m0/branch_b.1#0"]["label"]
    assert "branch_b.0 (Linear):26" in ops.clusters["cluster_m0/branch_b"].attrs["label"]
    assert "F.linear()" not in picture(log("ops")).source
    assert "F.linear()" not in ops.nodes["m0/branch_a.0#0"]["label"]  # not zoomed
    assert calls(plain) == calls(ops) and solid(plain) == solid(ops)


def test_ops_changes_nothing_without_zoomed_calls() -> None:
    assert picture(log("detached"), ops=True).source == picture(log("detached")).source


# -- errors and warnings ---------------------------------------------------------------------------

def test_a_log_without_events_is_a_log_error() -> None:
    with pytest.raises(LogError, match=r"crash\.jsonl has no events: no module call was recorded"):
        picture(log("crash"))


def test_render_warns_where_the_log_was_cut_off(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    lines = log("mnist").read_bytes().splitlines(keepends=True)
    cut.write_bytes(b"".join(lines[:-1]))  # no end record
    with pytest.warns(UserWarning, match="no end record"):
        pic = render(cut)
    assert pic.source == picture(log("mnist")).source
    assert any("no end record" in w for w in pic.warnings)
    assert picture(log("mnist")).warnings == []


# -- write_picture ---------------------------------------------------------------------------------

@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """mnist.jsonl, copied where outputs may be written beside it."""
    target = tmp_path / "run.jsonl"
    shutil.copy(log("mnist"), target)
    return target


def test_default_output_is_the_logs_name_with_the_format(copy: Path) -> None:
    written = write_picture(copy, fmt="dot")
    assert written.path == copy.with_suffix(".dot")
    assert written.path.read_text("utf-8") == picture(copy).source
    assert written.summary() == (f"wrote {written.path}: step 0, depth 1 (auto): 6 modules, "
                                 "10 edges (5 forward, 5 backward)")


def test_format_from_the_output_extension(copy: Path) -> None:
    written = write_picture(copy, copy.with_name("graph.DOT"))
    assert written.format == "dot"


def test_refuses_to_write_over_the_log(copy: Path) -> None:
    before = copy.read_bytes()
    with pytest.raises(HooktraceError, match="refusing to write the picture over the log"):
        write_picture(copy, copy, fmt="dot")
    assert copy.read_bytes() == before


def test_refuses_a_default_name_that_is_the_log(tmp_path: Path) -> None:
    named = tmp_path / "run.dot"  # a log with the picture's extension
    shutil.copy(log("mnist"), named)
    with pytest.raises(HooktraceError, match="refusing to write the picture over the log"):
        write_picture(named, fmt="dot")
    assert named.read_bytes() == log("mnist").read_bytes()


@pytest.mark.parametrize(("output", "fmt", "message"), [
    ("x.svg", "dot", "has the extension of svg, not dot"),
    ("x.dot", "gif", "unknown format 'gif'"),
    ("x.gif", None, "unknown format 'gif'"),
])
def test_format_errors(copy: Path, output: str, fmt: str | None, message: str) -> None:
    with pytest.raises(HooktraceError, match=message):
        write_picture(copy, copy.with_name(output), fmt)
    assert sorted(p.name for p in copy.parent.iterdir()) == ["run.jsonl"]


def test_output_directory_is_refused(copy: Path) -> None:
    with pytest.raises(HooktraceError, match="is a directory"):
        write_picture(copy, copy.parent, fmt="dot")


# -- hooktrace render (thin CLI) -------------------------------------------------------------------

def test_cli_render_dot(tmp_path: Path) -> None:
    out = tmp_path / "m.dot"
    result = CliRunner().invoke(cli, ["render", str(log("mnist")), "--format", "dot", "-o",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr == (f"hooktrace: wrote {out}: step 0, depth 1 (auto): 6 modules, "
                             "10 edges (5 forward, 5 backward)\n")
    assert out.read_text("utf-8") == picture(log("mnist")).source


def test_cli_render_options_reach_the_picture(tmp_path: Path) -> None:
    out = tmp_path / "g.dot"
    result = CliRunner().invoke(cli, ["render", str(log("gan")), "-o", str(out), "--model",
                                      "generator", "--phase", "forward", "--depth", "1"])
    assert result.exit_code == 0, result.output
    assert out.read_text("utf-8") == picture(log("gan"), model="generator", phase="forward",
                                             depth=1).source


def test_cli_render_says_where_the_other_problems_are(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["render", str(log("nan_layer")), "-o",
                                      str(tmp_path / "n.dot")])
    assert result.exit_code == 0
    assert result.stderr.splitlines()[-1] == ("hooktrace: check finds problems in other steps "
                                              "(3): --step 3 draws the first")


def test_cli_render_no_findings(tmp_path: Path) -> None:
    out = tmp_path / "d.dot"
    result = CliRunner().invoke(cli, ["render", str(log("detached")), "-o", str(out),
                                      "--no-findings"])
    assert result.exit_code == 0
    assert OUTLINE not in out.read_text("utf-8")
    assert "problem" not in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["crash.jsonl"], "has no events: no module call was recorded"),
    (["mnist.jsonl", "--step", "7"], "no step 7 in"),
    (["gan.jsonl", "--model", "critic"], "no model 'critic'"),
    (["mnist.jsonl", "--format", "gif"], "unknown format 'gif'"),
    (["nope.jsonl"], "no such log"),
])
def test_cli_render_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["render", str(LOGS / args[0]), *args[1:], "-o",
                                      str(tmp_path / "x.dot")])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("hooktrace: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []

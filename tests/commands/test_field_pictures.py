"""Pictures of the field programs (tests/scripts/field_pictures.py, issue 38 items 5 and 7): each
drawn by ``hooktrace render`` and laid out by the real ``dot`` (``-Tplain`` parsed), and compared
whole: every node, every edge with its number, each call inside the box of the parent that
called it. Also what ``view`` does with them: no deeper drawing too big to lay out (the unrolled
GRU), no row for a torchvision transform; and that the op zoom leaves a healthy GRU alone."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import Traced, hooktrace_cmd, names, read_log, run_findings

from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.show.graph import build
from hooktrace.show.steplog import load_step
from hooktrace.show.view.data import gather
from hooktrace.show.view.graphs import step_graphs

SCRIPT = Path(__file__).parent.parent / "scripts" / "field_pictures.py"
CASES = ("lstm", "two_parents", "wrapped", "made_in_forward", "gru", "transforms")

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")


def plain(dot_text: str) -> list[str]:
    """The picture as ``dot -Tplain`` lays it out: its nodes (``node ID``) and its edges
    (``forward N: A -> B``, ``backward N: A -> B`` in the gradient's direction, ``start -> B``
    where the backward starts), sorted; gradient norms left out."""
    laid = subprocess.run(["dot", "-Tplain"], input=dot_text, capture_output=True, text=True,
                          check=True).stdout
    found = []
    for line in laid.splitlines():
        if line.startswith("node "):
            ident = shlex.split(line[:line.index(" <") if " <" in line else len(line)])[1]
            if ident not in ("legend", "backward start"):
                found.append(f"node {ident}")
        elif line.startswith("edge "):
            words = shlex.split(line)
            tail, head, n = words[1], words[2], int(words[3])
            rest = words[4 + 2 * n:]
            label = rest[0].split(" · ")[0] if len(rest) == 5 else ""
            if tail == "backward start":
                found.append(f"start -> {head}")
            elif rest[-2] == "dashed":
                found.append(f"backward {label}: {head} -> {tail}")
            else:
                found.append(f"forward {label}: {tail} -> {head}")
    return sorted(found)


def boxes(dot_text: str) -> dict[str, str]:
    """Each node's innermost box (cluster) in the DOT text."""
    inside: dict[str, str] = {}
    stack: list[str] = []
    for line in dot_text.splitlines():
        line = line.strip()
        if m := re.match(r'subgraph "cluster_(.*)" \{', line):
            stack.append(m.group(1))
        elif line == "}" and stack:
            stack.pop()
        elif (m := re.match(r'"([^"]+)" \[label=', line)) and stack:
            inside[m.group(1)] = stack[-1]
    return inside


@pytest.fixture(scope="module")
def field(traced: Traced) -> dict[str, Path]:
    return {case: traced(SCRIPT, case) for case in CASES}


def dot_of(log: Path, tmp_path: Path, *options: str) -> str:
    out = tmp_path / f"{log.stem}.dot"
    result = hooktrace_cmd("render", "-o", out, *options, log)
    assert result.returncode == 0, result.stderr
    return out.read_text()


@pytest.mark.parametrize("case", CASES)
def test_the_field_programs_are_silent(field: dict[str, Path], case: str) -> None:
    check = hooktrace_cmd("check", "--json", field[case])
    status, found = run_findings((subprocess.CompletedProcess([], 0, "", ""), check))
    assert status == 0 and [f for f in found if f["severity"] != "note"] == []


@needs_dot
def test_a_consumer_of_one_output_is_joined_to_its_maker_only(field: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """``rnn`` returns ``(proj(out), (h, c))``: ``head`` uses the first, made by ``rnn.proj``;
    the LSTM made only ``h`` and ``c``, so no edge joins it to ``head``."""
    assert plain(dot_of(field["lstm"], tmp_path)) == sorted([
        "node m0/embed#0", "node m0/rnn.lstm#0", "node m0/rnn.proj#0", "node m0/head#0",
        "forward 1: m0/embed#0 -> m0/rnn.lstm#0",
        "forward 2: m0/rnn.lstm#0 -> m0/rnn.proj#0",
        "forward 3: m0/rnn.proj#0 -> m0/head#0",
        "start -> m0/head#0",
        "backward 1: m0/head#0 -> m0/rnn.proj#0",
        "backward 2: m0/rnn.proj#0 -> m0/rnn.lstm#0",
        "backward 3: m0/rnn.lstm#0 -> m0/embed#0",
    ])


@needs_dot
def test_a_module_under_two_parents_is_drawn_inside_the_one_that_called_it(
        field: dict[str, Path], tmp_path: Path) -> None:
    text = dot_of(field["two_parents"], tmp_path)
    assert plain(text) == sorted([
        "node m0/encoder.block#0", "node m0/decoder.block#0", "node m0/head#0",
        "forward 1: m0/encoder.block#0 -> m0/decoder.block#0",
        "forward 2: m0/decoder.block#0 -> m0/head#0",
        "start -> m0/head#0",
        "backward 1: m0/head#0 -> m0/decoder.block#0",
        "backward 2: m0/decoder.block#0 -> m0/encoder.block#0",
    ])
    assert boxes(text) == {"m0/encoder.block#0": "m0/encoder",
                           "m0/decoder.block#0": "m0/decoder", "m0/head#0": "m0/"}
    modules = {r.fqn: r for r in read_log(field["two_parents"]) if isinstance(r, schema.Module)}
    assert modules["encoder.block"].aliases == ["decoder.block"]
    assert (modules["decoder.block"].alias_of, modules["decoder.block"].params) == (
        "encoder.block", 0)


@needs_dot
def test_a_backbone_called_by_its_wrapper_only_is_drawn_inside_it(field: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """BYOL's learner holds the backbone as ``net`` and inside ``online_encoder``, which alone
    calls it: its calls and its layers' are ``online_encoder.net...``, in that box; ``net``,
    never called under its first name, is not reported unused."""
    text = dot_of(field["wrapped"], tmp_path)
    assert plain(text) == sorted([
        "node m0/online_encoder.net.0#0", "node m0/online_encoder.net.1#0",
        "node m0/online_encoder.projection#0", "node m0/head#0",
        "forward 1: m0/online_encoder.net.0#0 -> m0/online_encoder.net.1#0",
        "forward 2: m0/online_encoder.net.1#0 -> m0/online_encoder.projection#0",
        "forward 3: m0/online_encoder.projection#0 -> m0/head#0",
        "start -> m0/head#0",
        "backward 1: m0/head#0 -> m0/online_encoder.projection#0",
        "backward 2: m0/online_encoder.projection#0 -> m0/online_encoder.net.1#0",
        "backward 3: m0/online_encoder.net.1#0 -> m0/online_encoder.net.0#0",
    ])
    assert boxes(text) == {"m0/online_encoder.net.0#0": "m0/online_encoder.net",
                           "m0/online_encoder.net.1#0": "m0/online_encoder.net",
                           "m0/online_encoder.projection#0": "m0/online_encoder",
                           "m0/head#0": "m0/"}


def test_include_by_the_first_name_records_the_calls_under_the_second(traced: Traced) -> None:
    log = traced(SCRIPT, "wrapped", options=("--include", "net*"))
    assert names(log, "forward") == ["online_encoder.net.0", "online_encoder.net.1",
                                     "online_encoder.net"]


@needs_dot
def test_layers_made_in_forward_are_drawn_by_their_names(field: dict[str, Path],
                                                         tmp_path: Path) -> None:
    """The encoder builds ``self.net`` and the model ``self.fc`` in their first forward (a
    sizing call under no_grad, then the training step's)."""
    assert names(field["made_in_forward"], "forward") == [
        "encoder.net.0", "encoder.net.1", "encoder.net", "encoder", "fc", ""] * 2
    assert plain(dot_of(field["made_in_forward"], tmp_path)) == sorted([
        *(f"node m0/{name}#{call}" for name in ("encoder.net.0", "encoder.net.1", "fc")
          for call in (0, 1)),
        "forward 1: m0/encoder.net.0#0 -> m0/encoder.net.1#0",
        "forward 2: m0/encoder.net.1#0 -> m0/fc#0",
        "forward 3: m0/encoder.net.0#1 -> m0/encoder.net.1#1",
        "forward 4: m0/encoder.net.1#1 -> m0/fc#1",
        "start -> m0/fc#1",
        "backward 1: m0/fc#1 -> m0/encoder.net.1#1",
        "backward 2: m0/encoder.net.1#1 -> m0/encoder.net.0#1",
    ])


def test_include_finds_a_layer_made_in_forward_by_its_name(traced: Traced) -> None:
    log = traced(SCRIPT, "made_in_forward", options=("--include", "encoder.net*"))
    assert names(log, "forward") == ["encoder.net.0", "encoder.net.1", "encoder.net"] * 2
    assert names(log, "backward") == ["encoder.net", "encoder.net.1", "encoder.net.0"]


@needs_dot
def test_an_unrolled_gru_is_drawn_call_by_call(field: dict[str, Path], tmp_path: Path) -> None:
    """makemore's GRU, 16 characters: each cell call takes a character's embedding and the
    hidden state of the call before; ``lm_head`` takes them all, stacked."""
    cells = range(16)
    forward = ["forward 1: m0/wte#0 -> m0/cell#0"]
    for i in cells[1:]:
        forward += [f"forward {2 * i}: m0/wte#0 -> m0/cell#{i}",
                    f"forward {2 * i + 1}: m0/cell#{i - 1} -> m0/cell#{i}"]
    forward += [f"forward {32 + i}: m0/cell#{i} -> m0/lm_head#0" for i in cells]
    backward = ["backward 1: m0/lm_head#0 -> m0/cell#15"]
    for k in range(14, -1, -1):
        backward += [f"backward {2 * (14 - k) + 2}: m0/lm_head#0 -> m0/cell#{k}",
                     f"backward {2 * (14 - k) + 3}: m0/cell#{k + 1} -> m0/cell#{k}"]
    backward += [f"backward {32 + 15 - k}: m0/cell#{k} -> m0/wte#0" for k in cells]
    nodes = ["node m0/wte#0", "node m0/lm_head#0", *(f"node m0/cell#{i}" for i in cells)]
    assert plain(dot_of(field["gru"], tmp_path)) == sorted(
        [*nodes, *forward, "start -> m0/lm_head#0", *backward])


def test_a_healthy_unrolled_cell_is_not_zoomed_into(field: dict[str, Path]) -> None:
    """The first cell call's reset gate gets an all-zero gradient (``r * hprev`` at a zero
    start), while its other 15 calls get one: the cell is healthy, and no step of it is
    recorded down to its operations."""
    records = read_log(field["gru"])
    first = [e for e in records if isinstance(e, schema.BackwardEvent)
             and e.step == 0 and e.fqn == "cell.xh_to_r"]
    norms = [e.grad_output_stats[0][0] for e in first if e.grad_output_stats]
    assert norms[-1] == 0 and all(n > 0 for n in norms[:-1])  # backward order: call 0 last
    assert [r for r in records if isinstance(r, schema.Ops)] == []


@needs_dot
def test_view_leaves_out_a_deeper_drawing_too_big_to_lay_out(field: dict[str, Path]) -> None:
    """One level deeper the GRU's 16 cell calls are their 48 Linear calls: over 500 edges, a
    layout of about 20 s each step (the page took 54 s for 3 steps): the page offers none."""
    from hooktrace.show.view import graphs

    loaded = load_step(str(field["gru"]), 0)
    view = build(loaded)
    assert len(build(loaded, view.depth + 1).edges()) > getattr(graphs, "MAX_UNFOLD_EDGES", 500)
    drawn = step_graphs(gather(LogReader(field["gru"])), [])
    assert sorted(drawn) == ["|0", "|1", "|2"]
    assert [key for key, graph in drawn.items() if "unfold" in graph] == []
    assert all(graph["svg"].startswith("<svg") for graph in drawn.values())


@needs_dot
def test_view_has_no_row_for_a_transform(field: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "heatmap.svg"
    result = hooktrace_cmd("view", "--format", "svg", "-o", out, field["transforms"])
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    for layer in ("Conv2d", "ReLU", "Flatten", "Linear"):
        assert layer in text
    for transform in ("Compose", "RandomHorizontalFlip", "Normalize"):
        assert transform not in text


def test_the_model_chooser_has_no_transform(field: dict[str, Path], tmp_path: Path) -> None:
    """The page's model chooser offers the model only, not the torchvision transforms that
    prepared its data (``augment``, a v2.Compose: a model of the log), and draws no graph of
    them (before: 'augment' beside 'model', with three step graphs of its own)."""
    out = tmp_path / "page.html"
    result = hooktrace_cmd("view", "-o", out, field["transforms"])
    assert result.returncode == 0, result.stderr
    blob = out.read_text().split('id="data">')[1].split("</script>", 1)[0]
    [rank] = json.loads(blob.replace("<\\/", "</"))["ranks"]
    assert rank["models"] == ["model"]
    assert sorted(rank["graphs"]) == ["|0", "|1", "|2"]
    assert "augment" in gather(LogReader(field["transforms"])).models.values()  # in the log

"""``hooktrace show``: the event table of one step, checked row by row against the events the
log's reader yields (seq order, phase, call, fqn indented by depth, class, gradient counts,
shapes), ``--limit``, ``--phase``, ``--model``, the operations of zoomed calls, ``--edges``,
the examples in docs/reading.md, and the thin CLI."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooktrace.cli import cli
from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.show.render.text import show, show_edges
from unit.logs import LOGS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reading.md"
DRAWN = sorted(p.stem for p in LOGS.glob("*.jsonl") if p.stem != "crash")
FOOTER = ("shapes: forward input -> output; backward grad_output -> grad_input (- where no "
          "gradient flowed)")

Event = schema.ForwardEvent | schema.BackwardEvent


def log(name: str) -> Path:
    return LOGS / f"{name}.jsonl"


@cache
def read(name: str) -> tuple[list[Event], dict[tuple[int, str], str], dict[int, str]]:
    """The log's events, each module's class and each model's name, from the reader."""
    found: list[Event] = []
    classes: dict[tuple[int, str], str] = {}
    models: dict[int, str] = {}
    for r in LogReader(log(name)):
        if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent)):
            found.append(r)
        elif isinstance(r, schema.Module):
            classes[(r.model, r.fqn)] = r.cls
        elif isinstance(r, schema.Model):
            models[r.model] = r.name
    return found, classes, models


def shapes(items: Sequence[schema.Shape | None]) -> str:
    """How the table writes shapes: ``8x3x32x32``, ``()`` a scalar, ``-`` no gradient; at most
    three, then ``+N``."""
    texts = ["-" if s is None else "x".join(map(str, s)) if len(s) else "()" for s in items]
    return ", ".join(texts[:3]) + (f" +{len(texts) - 3}" if len(texts) > 3 else "")


def expected_shapes(e: Event) -> str:
    if isinstance(e, schema.ForwardEvent):
        return f"{shapes(e.input_shapes)} -> {shapes(e.output_shapes)}"
    return f"{shapes(e.grad_output_shapes)} -> {shapes(e.grad_input_shapes)}"


def table_rows(text: str) -> tuple[str, list[str]]:
    """(the column heading, the event rows) of a table."""
    lines = text.splitlines()
    assert lines[1] == "" and lines[2].startswith("seq  phase")
    rows = []
    for line in lines[3:]:
        if not re.match(r"^\s*\d+  ", line):
            break
        rows.append(line)
    return lines[2], rows


# -- every log: the table is its events ------------------------------------------------------------

@pytest.mark.parametrize("name", DRAWN)
def test_rows_are_the_steps_events_in_seq_order(name: str) -> None:
    shown = show(log(name), limit=0)
    step = int(shown.text.split()[1])
    events, classes, models = read(name)
    mine = [e for e in events if e.step == step]
    head, rows = table_rows(shown.text)
    assert [int(r.split()[0]) for r in rows] == [e.seq for e in mine]
    several = len({e.model for e in mine}) > 1
    assert ("model" in head.split()) == several
    col = {name: head.index(name) for name in ("phase", "call", "fqn", "class", "grads",
                                               "shapes")}
    for row, e in zip(rows, mine, strict=True):
        assert row[col["phase"]:].startswith(e.phase + " ")
        assert row[col["call"]:].startswith(f"{e.call} ")
        fqn = e.fqn or "(root)"
        depth = e.fqn.count(".") + 1 if e.fqn else 0
        assert row[col["fqn"]:col["fqn"] + 2 * depth].strip() == ""
        assert row[col["fqn"] + 2 * depth:].startswith(fqn + " ")
        assert row[col["class"]:].startswith(classes[(e.model, e.fqn)] + " ")
        grads = f"{e.grad_output_len}/{e.grad_input_len}" \
            if isinstance(e, schema.BackwardEvent) else ""
        assert row[col["grads"]:col["shapes"]].strip() == grads
        assert row[col["shapes"]:] == expected_shapes(e)
        if several:
            assert row[head.index("model"):].startswith(models[e.model] + " ")
    assert shown.text.rstrip("\n").splitlines()[len(rows) + 4] == FOOTER


def test_gradient_counts_run_as_the_shapes_do() -> None:
    """vae's root takes one input and returns three outputs: its backward row counts 3
    grad_outputs then 1 grad_input, as its shapes column lists them (out -> in)."""
    head, rows = table_rows(show(log("vae"), phase="backward").text)
    root = next(r for r in rows if r.split()[3] == "(root)")
    grads = root[head.index("grads"):head.index("shapes")].strip()
    outs, ins = root[head.index("shapes"):].split(" -> ")
    assert "grads out/in" in head and grads == "3/1"
    assert (len(outs.split(", ")), len(ins.split(", "))) == (3, 1)


@pytest.mark.parametrize(("module", "fqns"), [
    ("conv*", {"conv1", "conv2"}),
    ("fc1", {"fc1"}),
    ("Conv2d", {"conv1", "conv2"}),  # by class
    ("Drop*", {"dropout1", "dropout2"}),
    ("Net", {"(root)"}),
    ("(root)", {"(root)"}),
    ("*", {"(root)", "conv1", "conv2", "dropout1", "dropout2", "fc1", "fc2"}),
])
def test_module_glob_keeps_the_modules_it_matches(module: str, fqns: set[str]) -> None:
    text = show(log("mnist"), module=module, limit=0).text
    _, rows = table_rows(text)
    assert {r.split()[3] for r in rows} == fqns
    every = table_rows(show(log("mnist"), limit=0).text)[1]
    assert [r.split() for r in rows] == [r.split() for r in every if r.split()[3] in fqns]
    assert text.splitlines()[0].endswith(f"; {len(rows)} events of modules matching {module!r}")


@pytest.mark.parametrize("name", DRAWN)
def test_heading_counts_the_steps_events(name: str) -> None:
    text = show(log(name)).text
    step = int(text.split()[1])
    events = [e for e in read(name)[0] if e.step == step]
    forward = sum(e.phase == "forward" for e in events)
    first = text.splitlines()[0]
    assert first.endswith(f": {forward} forward event{'s' * (forward != 1)}, "
                          f"{len(events) - forward} backward event"
                          f"{'s' * (len(events) - forward != 1)}")
    steps = sorted({e.step for e in read(name)[0]})
    assert f"(steps in the log: {steps[0]}-{steps[-1]})" in first or len(steps) == 1


# -- mnist: the docs' example, exact ---------------------------------------------------------------

def docs_block(command: str) -> str:
    """The output under ``$ COMMAND`` in docs/reading.md's fenced example."""
    text = DOCS.read_text("utf-8")
    start = text.index(f"$ {command}\n") + len(command) + 3
    return text[start:text.index("```", start)]


def test_mnist_backward_table_is_the_docs_example() -> None:
    assert show(log("mnist"), phase="backward").text == \
        docs_block("hooktrace show hooktrace.jsonl --phase backward")


def test_vae_edges_are_the_docs_example() -> None:
    assert show_edges(log("vae")).text == docs_block("hooktrace show hooktrace.jsonl --edges")


def test_mnist_forward_shapes_exact() -> None:
    _, rows = table_rows(show(log("mnist"), phase="forward").text)
    assert [r.split("  ")[-1].strip() for r in rows] == [
        "8x1x28x28 -> 8x32x26x26", "8x32x26x26 -> 8x64x24x24", "8x64x12x12 -> 8x64x12x12",
        "8x9216 -> 8x128", "8x128 -> 8x128", "8x128 -> 8x10", "8x1x28x28 -> 8x10"]


# -- --limit ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("limit", "rows", "more"), [
    (1, 1, "... 13 more events"), (3, 3, "... 11 more events"), (13, 13, "... 1 more event:"),
    (14, 14, None), (100, 14, None), (0, 14, None)])
def test_limit(limit: int, rows: int, more: str | None) -> None:
    text = show(log("mnist"), limit=limit).text
    assert len(table_rows(text)[1]) == rows
    lines = text.splitlines()
    if more is None:
        assert not any(line.startswith("...") for line in lines)
    else:
        assert lines[3 + rows].startswith(more)
        assert lines[3 + rows].endswith("--limit 0 shows all; --phase, --model and --step "
                                        "narrow the view")


# -- --phase, --step, --model ----------------------------------------------------------------------

@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_phase_keeps_that_phase(phase: str) -> None:
    text = show(log("detached"), phase=phase, limit=0).text
    _, rows = table_rows(text)
    assert rows and all(r.split()[1] == phase for r in rows)
    assert len(rows) == (9 if phase == "forward" else 5)
    assert text.splitlines()[0].endswith("9 forward events, 5 backward events")  # the step's


def test_a_phase_with_no_events_says_so() -> None:
    text = show(log("gan"), model="generator", step=1, phase="forward").text
    assert text.splitlines()[1] == "no forward events in step 1"


def test_no_grad_calls_are_flagged() -> None:
    _, rows = table_rows(show(log("eval_mode"), step=3).text)
    assert [r.split()[1:3] for r in rows[:6]] == [["forward", "no_grad"]] * 6
    assert rows[6].split()[1:3] == ["forward", "1"]


def test_step_and_model_select() -> None:
    text = show(log("gan"), step=2, model="discriminator").text
    head, rows = table_rows(text)
    assert text.startswith("step 2 (steps in the log: 0-3): discriminator (Sequential): ")
    assert "model" not in head.split()  # one model: no model column
    events = [e for e in read("gan")[0] if e.step == 2 and e.model == 1]
    assert [int(r.split()[0]) for r in rows] == [e.seq for e in events]


def test_backward_of_an_earlier_steps_calls_is_a_warning() -> None:
    shown = show(log("gan"), model="generator", step=1)
    assert shown.text.startswith("step 1 ")
    assert shown.warnings == ["step 1 also runs the backward of calls made in an earlier step "
                              "(model generator); they are drawn in that step"]
    assert show(log("gan")).warnings == []


def test_default_step_of_a_model_is_the_step_of_its_calls() -> None:
    """The generator's forward runs in step 0, its backward in step 1: the default is step 0,
    where its calls are, as it is for every model together."""
    shown = show(log("gan"), model="generator")
    assert shown.text.startswith("step 0 ") and shown.warnings == []
    assert "no forward call" not in shown.text


# -- operations of zoomed calls --------------------------------------------------------------------

def test_zoomed_calls_list_their_operations() -> None:
    text = show(log("ops")).text
    tail = text.split("operations inside the zoomed calls (--ops):\n")[1]
    assert tail.splitlines()[:2] == [
        "  branch_b.0 (Linear) call 0 (forward seq 5): 1 operations",
        "    0  F.linear()  detached_branch.py:26  8x16, 32x16, 32 -> 8x32"]
    assert tail.count(" call 0 (forward seq ") == 4


@pytest.mark.parametrize(("name", "phase"), [("ops", "backward"), ("detached", None),
                                             ("mnist", None)])
def test_no_operations_listed(name: str, phase: str | None) -> None:
    assert "operations inside" not in show(log(name), phase=phase).text


# -- --edges ---------------------------------------------------------------------------------------

def test_edges_at_a_depth() -> None:
    text = show_edges(log("detached"), depth=1).text
    assert text.splitlines()[0].endswith("depth 1 of 2: 0 forward edges, 0 backward edges")
    text = show_edges(log("detached")).text
    assert text.splitlines()[0].endswith("depth 2 of 2 (auto): 4 forward edges, "
                                         "2 backward edges")
    assert "  3  branch_b.0 -> branch_b.1\n" in text


def test_edges_of_several_models_name_the_model() -> None:
    text = show_edges(log("gan")).text
    assert "   7  generator:3 -> discriminator:0 (call 2/2)\n" in text


def test_edges_limit() -> None:
    text = show_edges(log("mnist"), limit=3).text
    assert text.count(" -> ") == 3
    assert text.splitlines()[-1] == ("... 7 more edges: --limit 0 shows all; --depth, --phase, "
                                     "--model and --step narrow the view")
    assert "more edge" not in show_edges(log("mnist"), limit=10).text


def test_edges_phase() -> None:
    forward = show_edges(log("mnist"), phase="forward").text
    assert "backward:" not in forward and forward.count(" -> ") == 5
    backward = show_edges(log("mnist"), phase="backward").text
    assert "forward: from" not in backward and backward.count(" -> ") == 5


# -- hooktrace show (thin CLI) ---------------------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["--phase", "forward"], ["--limit", "4"], ["--step", "2"],
                                  ["--module", "conv*"], ["--edges"],
                                  ["--edges", "--depth", "0"]])
def test_cli_prints_the_library_text(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["show", str(log("mnist")), *args])
    assert result.exit_code == 0, result.output
    if "--edges" in args:
        depth = int(args[-1]) if "--depth" in args else None
        assert result.stdout == show_edges(log("mnist"), depth=depth, limit=100).text
    else:
        phase = args[1] if "--phase" in args else None
        limit = int(args[1]) if "--limit" in args else 100
        step = int(args[1]) if "--step" in args else None
        module = args[1] if "--module" in args else None
        assert result.stdout == show(log("mnist"), step, phase, None, limit, module).text
    assert result.stderr == ""


def test_cli_prints_warnings_to_stderr() -> None:
    result = CliRunner().invoke(cli, ["show", str(log("gan")), "--model", "generator",
                                      "--step", "1"])
    assert result.exit_code == 0
    assert result.stderr == ("hooktrace: warning: step 1 also runs the backward of calls made in "
                             "an earlier step (model generator); they are drawn in that step\n")


def test_cli_module_is_not_for_edges() -> None:
    result = CliRunner().invoke(cli, ["show", str(log("mnist")), "--module", "fc1", "--edges"])
    assert result.exit_code == 2
    assert "--module picks rows of the table" in result.stderr


def test_cli_depth_needs_edges() -> None:
    result = CliRunner().invoke(cli, ["show", str(log("mnist")), "--depth", "1"])
    assert result.exit_code == 2
    assert "--depth folds the edges of --edges" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["crash.jsonl"], "crash.jsonl has no events"),
    (["mnist.jsonl", "--step", "9"], "no step 9 in"),
    (["gan.jsonl", "--model", "critic"], "no model 'critic' in"),
    (["missing.jsonl"], "no such log"),
    (["mnist.jsonl", "--module", "layer4*"], "no module matching 'layer4*' ran in step 0"),
])
def test_cli_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["show", str(LOGS / args[0]), *args[1:]])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("hooktrace: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1

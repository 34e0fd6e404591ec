"""The data behind ``hooktrace view`` (``gather``: one pass over a log) and its gradient-flow
heatmap (modules in forward order x steps): long_run's NaN at watched step 50 marked where it
happened and nowhere before, "no gradient" on detached's branch_b only, findings on their cells,
``--no-stats`` left blank, the columns of a long run, and the heatmap's DOT and HTML text. The
page itself lays out its graphs with the ``dot`` program, so only its option errors are run."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooktrace.check.checklog import run_checks
from hooktrace.cli import cli
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.show.view import heatmap_picture
from hooktrace.show.view.data import RunData, gather
from hooktrace.show.view.heatmap import (
    EMPTY,
    MARKS,
    NONFINITE,
    Heatmap,
    colour,
    heatmap,
    to_html,
)
from hooktrace.show.view.heatmap import (
    heatmap_dot as to_dot,
)
from unit.logs import LOGS
from unit.show.dotparse import parse
from unit.show.handlog import Builder, chain

DRAWN = sorted(p.stem for p in LOGS.glob("*.jsonl") if p.stem != "crash")
NO_GRAD_FILL, NO_GRAD_TEXT = MARKS["no-grad"][0], MARKS["no-grad"][1]


@cache
def data(name: str) -> RunData:
    return gather(LogReader(LOGS / f"{name}.jsonl"))


def heat(name: str, values: str = "grad_output", findings: bool = False) -> Heatmap:
    found = run_checks(LOGS / f"{name}.jsonl").findings if findings else []
    return heatmap(data(name), found, values)


def row(h: Heatmap, label: str, model: int = 0) -> int:
    """The row of the module whose fqn is ``label`` (``""``: the root)."""
    return h.rows.index((model, label))


# -- long_run: NaN at watched step 50 --------------------------------------------------------------

def test_long_run_columns_are_the_recorded_and_the_watched_steps() -> None:
    h = heat("long_run")
    assert h.steps == [0, 1, *range(50, 60)]
    assert h.watched == set(range(50, 60))  # anomaly records only, no events
    assert h.rows == [(0, ""), (0, "fc1"), (0, "act"), (0, "norm"), (0, "fc2")]
    assert h.labels == ["(root) (Regressor)", "fc1 (Linear)", "act (ReLU)",
                        "norm (ScheduledNorm)", "fc2 (Linear)"]
    assert h.depths == [0, 1, 1, 1, 1]


def test_long_run_nan_first_marked_at_step_50() -> None:
    h = heat("long_run")
    at = h.steps.index(50)
    for name in ("norm", ""):  # the first NaN output, and the model's backward
        cell = h.cells[row(h, name)][at]
        assert (cell.fill, cell.text) == (NONFINITE, "NaN")
        assert "anomaly nonfinite" in cell.tip
    for name in ("fc1", "act", "fc2"):  # not yet at step 50
        assert h.cells[row(h, name)][at].fill == EMPTY
    assert h.cells[row(h, "fc1")][h.steps.index(51)].text == "NaN"  # from then on, fc1 first


@pytest.mark.parametrize("step", [0, 1])
def test_long_run_recorded_steps_are_finite(step: int) -> None:
    h = heat("long_run")
    at = h.steps.index(step)
    for cells in h.cells:
        cell = cells[at]
        assert cell.text == "" and cell.fill not in (NONFINITE, EMPTY)
        assert cell.log10 is not None and math.isfinite(cell.log10)


@pytest.mark.parametrize("name", DRAWN)
def test_nan_marked_only_in_runs_that_went_nan(name: str) -> None:
    h = heat(name)
    marked = {(h.rows[i], h.steps[j]) for i, cells in enumerate(h.cells)
              for j, c in enumerate(cells) if c.fill == NONFINITE}
    went_nan = {"long_run": 50, "nan_layer": 3, "diff_nan": 3}
    if name in went_nan:
        assert marked and min(step for _, step in marked) == went_nan[name]
    else:
        assert marked == set()


# -- gather: one pass ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DRAWN)
def test_rows_are_every_module_that_ran_in_forward_order(name: str) -> None:
    found = data(name)
    rows = found.rows()
    called = {(model, fqn) for model, fqn, _ in found.cells if (model, fqn) in found.first_seq}
    assert set(rows) == called
    for i, (model, fqn) in enumerate(rows):  # a module comes before the modules inside it
        for model2, fqn2 in rows[i + 1:]:
            inside = bool(fqn) and (fqn2 == "" or fqn.startswith(fqn2 + "."))
            assert not (model == model2 and inside), (fqn, fqn2)
    assert found.steps == set(found.columns()) - {a.step for a in found.anomalies}


def test_cells_count_calls_and_backward() -> None:
    found = data("eval_mode")
    cell = found.cells[(0, "0", 3)]  # a validation pass under no_grad, then a training one
    assert (cell.calls, cell.no_grad, cell.backward) == (1, 1, 1)
    assert found.cells[(0, "0", 0)].no_grad == 0


# -- marks: no gradient, findings, no statistics ---------------------------------------------------

def test_detached_branch_b_has_no_gradient_in_every_step() -> None:
    h = heat("detached")
    for i, (_, fqn) in enumerate(h.rows):
        texts = {c.text for c in h.cells[i]}
        fills = {c.fill for c in h.cells[i]}
        if fqn.startswith("branch_b"):
            assert (texts, fills) == ({NO_GRAD_TEXT}, {NO_GRAD_FILL})
        else:
            assert texts == {""} and NO_GRAD_FILL not in fills


def test_parameter_values_mark_modules_whose_parameters_got_no_gradient() -> None:
    h = heat("detached", "params")
    marked = {h.rows[i][1] for i, cells in enumerate(h.cells)
              if any(c.text == NO_GRAD_TEXT for c in cells)}
    assert marked == {"branch_b.0", "branch_b.2"}  # ReLU has no parameters
    assert h.values == "params"


@pytest.mark.parametrize(("name", "module", "step"), [
    ("dead_relu", "act2", 0), ("exploding", "layers.0", 0), ("detached", "", 0),
    ("nan_layer", "compress", 3)])
def test_findings_mark_their_cell(name: str, module: str, step: int) -> None:
    h = heat(name, findings=True)
    marked = {(h.rows[i][1], h.steps[j]) for i, cells in enumerate(h.cells)
              for j, c in enumerate(cells) if c.finding}
    assert (module, step) in marked
    assert not any(c.finding for cells in heat(name).cells for c in cells)  # none given


def test_finding_of_every_step_flags_the_row() -> None:
    h = heat("frozen", findings=True)
    assert h.flagged_rows == {row(h, "layers.2")}
    assert heat("frozen").flagged_rows == set()


@pytest.mark.parametrize("name", ["mnist", "vae", "diff_a"])
def test_healthy_runs_have_no_marks(name: str) -> None:
    h = heat(name, findings=True)
    assert h.flagged_rows == set()
    for cells in h.cells:
        for c in cells:
            assert c.text == "" and not c.finding and c.fill != EMPTY
    fills = {c.fill for cells in h.cells for c in cells}
    assert {colour(0), colour(1)} <= fills  # the smallest and largest norm set the scale


def test_gan_notes_do_not_mark_cells() -> None:
    assert run_checks(LOGS / "gan.jsonl").findings  # two notes: modules called twice
    assert not any(c.finding for cells in heat("gan", findings=True).cells for c in cells)


def test_no_stats_cells_are_blank() -> None:
    h = heat("diff_nostats")
    assert (h.low, h.high) == (None, None)
    assert {(c.fill, c.text) for cells in h.cells for c in cells} == {(EMPTY, "")}
    assert h.cells[0][0].tip == "1 call, 1 backward"


def test_colour_scale_ends() -> None:
    assert (colour(0), colour(1), colour(-3), colour(7)) == ("#440154", "#fde725", "#440154",
                                                             "#fde725")
    assert colour(0.5) == "#21918c"


# -- long runs: columns ----------------------------------------------------------------------------

@pytest.mark.parametrize(("steps", "columns"), [(200, 200), (201, 101), (30, 30)])
def test_a_long_run_shows_every_nth_step(tmp_path: Path, steps: int, columns: int) -> None:
    b = Builder()
    b.model(0, "net", "Net", {"fc": "Linear"})
    for step in range(steps):
        chain(b, step, ["fc"], params=False)
    found = gather(LogReader(b.write(tmp_path / "log.jsonl")))
    assert len(found.columns()) == columns
    assert found.columns()[0] == 0
    assert len(heatmap(found).steps) == columns


# -- the heatmap as text ---------------------------------------------------------------------------

def test_heatmap_picture_is_dot() -> None:
    pic = heatmap_picture(LOGS / "long_run.jsonl")
    dot = parse(pic.source)
    assert dot.directed and set(dot.nodes) == {"heat", "legend"}
    assert [(e.tail, e.head, e.attrs) for e in dot.edges] == [("heat", "legend",
                                                              {"style": "invis"})]
    label = dot.nodes["heat"]["label"]
    assert "<B>long_run.jsonl</B>" in label and "log10 grad_output norm" in label
    assert ">50w</FONT>" in label and ">1</FONT>" in label and ">1w</FONT>" not in label
    assert pic.warnings == []
    assert pic.source == heatmap_picture(LOGS / "long_run.jsonl").source


def test_heatmap_picture_of_parameter_norms() -> None:
    dot = parse(heatmap_picture(LOGS / "mnist.jsonl", "params").source)
    assert "log10 parameter-gradient norm" in dot.nodes["heat"]["label"]
    with pytest.raises(HooktraceError, match="unknown values 'weights'"):
        heatmap_picture(LOGS / "mnist.jsonl", "weights")


def test_to_dot_draws_findings_with_a_border() -> None:
    h = heat("dead_relu", findings=True)
    text = to_dot(h)
    assert text.count('BORDER="2" COLOR="#000000"') == 2  # the cell, and the legend's example
    assert to_dot(heat("dead_relu")).count('BORDER="2" COLOR="#000000"') == 1


def test_to_html_cells_have_ids_tips_and_finding_classes() -> None:
    h = heat("dead_relu", findings=True)
    text = to_html(h, rank=0)
    i = row(h, "act2")
    assert f'<td id="h0-grad_output-{i}-0" class="finding"' in text
    assert f'<td id="h0-grad_output-{i}-1" style=' in text
    assert text.count("<tr data-row=") == len(h.rows)
    assert text.count("<td id=") == len(h.rows) * len(h.steps)


def test_to_html_escapes_names(tmp_path: Path) -> None:
    b = Builder()
    b.model(0, "net", "Net", {"fc": "Lin<ear>"})
    chain(b, 0, ["fc"])
    text = to_html(heatmap(gather(LogReader(b.write(tmp_path / "log.jsonl")))), rank=0)
    assert "fc (Lin&lt;ear&gt;)" in text and "Lin<ear>" not in text


# -- hooktrace view: option errors need no dot -----------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--format", "pdf"], "hooktrace: error: unknown format 'pdf'; choose one of html, svg, png"),
    (["--rank", "3"], "hooktrace: error: no log of rank 3 among the logs given"),
])
def test_cli_view_bad_option_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["view", str(LOGS / "mnist.jsonl"), "-o",
                                      str(tmp_path / "page.html"), *args])
    assert result.exit_code == 2
    assert result.stderr == message + "\n"
    assert list(tmp_path.iterdir()) == []


def test_cli_view_values_are_a_choice() -> None:
    result = CliRunner().invoke(cli, ["view", str(LOGS / "mnist.jsonl"), "--values", "weights"])
    assert result.exit_code == 2
    assert "'weights' is not one of 'grad_output', 'params'" in result.stderr

"""``diff`` on the checked-in logs: every log agrees with itself; diff_a against each variant of
tests/scripts/diff_train.py names exactly the first difference its switch makes (section, step,
module), and the same run the other way round names it from the other side; ``--step``,
``--model``, the tolerances; the JSON report's keys; docs/diff.md's example, exact; and the
thin CLI's exit status (0 agree, 1 differ, 2 bad input, one line)."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooktrace.cli import cli
from hooktrace.diff.compare import Difference, DiffReport, diff
from hooktrace.diff.report import diff_json, diff_text
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from unit.logs import LOGS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "diff.md"
WITH_EVENTS = sorted(p.stem for p in LOGS.glob("*.jsonl") if p.stem != "crash")


def log(name: str) -> Path:
    return LOGS / f"{name}.jsonl"


@cache
def against_a(variant: str, reverse: bool = False) -> DiffReport:
    a, b = log("diff_a"), log(f"diff_{variant}")
    return diff(b, a) if reverse else diff(a, b)


def where(d: Difference | None) -> tuple[object, ...] | None:
    return None if d is None else (d.kind, d.step, d.model, d.module, d.phase, d.call)


def steps_of(name: str) -> list[int]:
    """The steps with events, and the watched steps with anomaly records."""
    return sorted({r.step for r in LogReader(log(name))
                   if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent,
                                     schema.Anomaly))})


# -- a log against itself --------------------------------------------------------------------------

@pytest.mark.parametrize("name", WITH_EVENTS)
def test_a_log_agrees_with_itself(name: str) -> None:
    report = diff(log(name), log(name))
    assert not report.differ
    assert report.steps == steps_of(name)
    assert (report.ran, report.shapes, report.divergence, report.nonfinite) == (None,) * 4
    assert (report.renamed, report.params, report.param_steps, report.growth) == ([], [], 0, [])
    assert report.not_compared == ([] if name != "diff_nostats" else
                                   ["numbers and parameter gradients: A and B recorded with "
                                    "--no-stats"])
    assert diff_text(report).endswith("\nThe runs agree.")


def test_a_log_without_events_has_no_step_to_compare() -> None:
    with pytest.raises(HooktraceError, match="have no step in common"):
        diff(log("crash"), log("crash"))


# -- diff_a against each variant: the first difference, exactly ------------------------------------

VARIANTS = {  # variant: (ran, shapes, divergence) as where() gives them
    "lr": (None, None, ("value", 1, "model", "", "backward", 0)),  # step 0 agrees
    "extra": (("ran", 0, "model", "extra", "forward", 0), None,
              ("value", 0, "model", "", "backward", 0)),
    "nan": (None, None, ("nonfinite", 3, "model", "poison", "forward", 0)),
    "rename": (None, None, None),  # fc2 is head: matched, compared under A's name
    "swap": (("ran", 0, "model", "fc1", "forward", 0),
             ("shapes", 0, "model", "act", "forward", 0),
             ("value", 0, "model", "", "backward", 0)),
    "twice": (("ran", 0, "model", "act", "forward", 1), None,  # act's second call
              ("value", 0, "model", "act", "backward", 0)),
    "nostats": (None, None, None),  # compared on what both hold: what ran and shapes
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_first_difference_of_each_variant(variant: str) -> None:
    report = against_a(variant)
    ran, shapes, divergence = VARIANTS[variant]
    assert (where(report.ran), where(report.shapes), where(report.divergence)) == \
        (ran, shapes, divergence)
    assert report.differ == (variant != "nostats")


@pytest.mark.parametrize(("variant", "position", "message"), [
    ("extra", 3, "forward of extra call 0 ran in B only"),
    ("swap", 0, "another order: A ran forward of fc1 call 0 where B ran forward of act call 0"),
    ("twice", 2, "act has more forward calls in B than in A (A: 1): forward of act call 1 ran "
                 "in B only"),
])
def test_what_ran_says_what_and_where(variant: str, position: int, message: str) -> None:
    ran = against_a(variant).ran
    assert ran is not None
    assert (ran.position, ran.message) == (position, message)
    assert ran.a.count("[") == ran.b.count("[") == 1  # the event at the position, bracketed


@pytest.mark.parametrize(("variant", "message", "position"), [
    ("extra", "forward of extra call 0 ran in A only", 3),
    ("swap", "another order: A ran forward of act call 0 where B ran forward of fc1 call 0", 0),
    ("twice", "act has more forward calls in A than in B (B: 1): forward of act call 1 ran in "
              "A only", 2),
])
def test_the_other_way_round(variant: str, message: str, position: int) -> None:
    ran = against_a(variant, reverse=True).ran
    assert ran is not None and (ran.message, ran.position) == (message, position)


def test_lr_parts_at_step_one_and_grows() -> None:
    report = against_a("lr")
    assert report.nonfinite is None and report.param_steps == 4
    assert [p.step for p in report.params] == [1, 2, 3, 4]
    assert [(g["step"], g["module"]) for g in report.growth] == [
        (1, ""), (1, "fc2"), (1, "poison"), (1, "act"), (1, "fc1"), (2, "fc2"), (3, "fc2"),
        (4, "act")]
    assert all(g["relative"] > 0.002 for g in report.growth)


def test_nan_is_found_in_b_only() -> None:
    report = against_a("nan")
    assert report.nonfinite is report.divergence
    assert report.divergence is not None
    assert report.divergence.message == "forward of poison call 0: output 0 has NaN/Inf in B only"
    assert (report.divergence.a, report.divergence.b) == ("finite", "64 NaN, 0 Inf")
    assert [g["relative"] for g in report.growth] == [None] * 6  # NaN/Inf: no number
    assert [p.step for p in report.params] == [3, 4]
    reverse = against_a("nan", reverse=True).divergence
    assert reverse is not None and reverse.message.endswith("has NaN/Inf in A only")


def test_rename_is_reported_once_and_nothing_else() -> None:
    report = against_a("rename")
    assert report.renamed == [("model", "fc2", "head")]
    assert (report.ran, report.divergence, report.param_steps) == (None, None, 0)
    assert "renamed: fc2 in A is head in B (model 'model'); compared under A's name" in \
        diff_text(report)
    assert against_a("rename", reverse=True).renamed == [("model", "head", "fc2")]


def test_twice_changes_no_parameter_gradient() -> None:
    """ReLU twice is ReLU: the weights' gradients agree, act's grad_output does not."""
    report = against_a("twice")
    assert report.param_steps == 0
    assert {g["module"] for g in report.growth} == {"act"}


def test_nostats_is_compared_on_what_both_hold() -> None:
    report = against_a("nostats")
    assert report.steps == [0, 1, 2]
    assert report.not_compared == [
        "steps 3-4: only in A (B recorded with --steps 0:3)",
        "numbers and parameter gradients: B recorded with --no-stats"]
    text = diff_text(report)
    assert "3. numbers (rtol 0.002, atol 0): not compared" in text
    assert "4. parameter-gradient norms: not compared" in text
    assert against_a("nostats", reverse=True).not_compared == [
        "steps 3-4: only in B (A recorded with --steps 0:3)",
        "numbers and parameter gradients: A recorded with --no-stats"]


def test_docs_example_is_what_diff_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    shutil.copy(log("diff_a"), tmp_path / "a.jsonl")
    shutil.copy(log("diff_extra"), tmp_path / "extra.jsonl")
    monkeypatch.chdir(tmp_path)
    text = DOCS.read_text("utf-8")
    start = text.index("$ hooktrace diff a.jsonl extra.jsonl\n")
    block = text[text.index("\n", start) + 1:text.index("```", start)]
    assert diff_text(diff("a.jsonl", "extra.jsonl")) + "\n" == block


# -- --step, --model, tolerances -------------------------------------------------------------------

@pytest.mark.parametrize(("step", "differ"), [(0, False), (1, True), (4, True)])
def test_step_compares_one_step(step: int, differ: bool) -> None:
    report = diff(log("diff_a"), log("diff_lr"), step=step)
    assert report.steps == [step] and report.differ == differ
    if differ:
        assert report.divergence is not None and report.divergence.step == step


@pytest.mark.parametrize(("a", "b", "step", "message"), [
    ("diff_a", "diff_lr", 9, "step 9 is not in both logs"),
    ("diff_a", "diff_nostats", 4, "step 4 is not in both logs"),
])
def test_step_not_in_both(a: str, b: str, step: int, message: str) -> None:
    with pytest.raises(HooktraceError, match=message):
        diff(log(a), log(b), step=step)


@pytest.mark.parametrize("model", ["generator", "discriminator", "criterion"])
def test_model_compares_one_model(model: str) -> None:
    report = diff(log("gan"), log("gan"), model=model)
    assert not report.differ and report.steps == [0, 1, 2, 3]


def test_unknown_model_names_the_models() -> None:
    with pytest.raises(HooktraceError, match=r"no model 'critic' in .*; their models: criterion, "
                                             r"discriminator, generator"):
        diff(log("gan"), log("gan"), model="critic")


@pytest.mark.parametrize(("rtol", "atol", "differ"), [
    (0.002, 0.0, True), (0.1, 0.0, True), (0.2, 0.0, False), (0.002, 10.0, False)])
def test_tolerances(rtol: float, atol: float, differ: bool) -> None:
    """lr 0.2: 0.6% at step 1, 13% at step 3, within 20% everywhere."""
    report = diff(log("diff_a"), log("diff_lr"), rtol=rtol, atol=atol)
    assert report.differ == differ
    assert f"3. numbers (rtol {rtol:g}, atol {atol:g}): " in diff_text(report)


def test_tolerance_never_hides_what_ran() -> None:
    """Nor a gradient in one run only: extra's parameters have none in A."""
    report = diff(log("diff_a"), log("diff_extra"), rtol=100.0, atol=100.0)
    assert report.differ and report.ran is not None
    assert report.divergence is None
    assert report.param_steps == 5
    assert [p.modules for p in report.params[:1]] == [[("extra", None, 0.5056)]]


# -- the JSON report -------------------------------------------------------------------------------

REPORT_KEYS = {"differ", "a", "b", "rtol", "atol", "steps", "renamed", "ran", "shapes",
               "divergence", "nonfinite", "growth", "params", "param_steps", "not_compared",
               "warnings"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_json_report_keys(variant: str) -> None:
    report = against_a(variant)
    data = json.loads(diff_json(report))
    assert set(data) == REPORT_KEYS
    assert data["differ"] == report.differ
    difference_keys = {f.name for f in fields(Difference)}
    for section in ("ran", "shapes", "divergence", "nonfinite"):
        assert data[section] is None or set(data[section]) == difference_keys
    assert all(set(g) == {"step", "module", "phase", "relative"} for g in data["growth"])
    assert all(set(p) == {"step", "model", "count", "modules"} for p in data["params"])


def test_json_report_values() -> None:
    data = json.loads(diff_json(against_a("extra")))
    assert data["steps"] == [0, 1, 2, 3, 4]
    assert data["ran"]["module"] == "extra" and data["ran"]["position"] == 3
    assert data["params"][0]["modules"][2] == ["extra", None, 0.5056]
    assert data["param_steps"] == 5


# -- hooktrace diff (thin CLI) ---------------------------------------------------------------------

@pytest.mark.parametrize(("variant", "status"), [
    ("a", 0), ("nostats", 0), ("lr", 1), ("extra", 1), ("nan", 1), ("rename", 1), ("swap", 1),
    ("twice", 1)])
def test_cli_exit_status(variant: str, status: int) -> None:
    result = CliRunner().invoke(cli, ["diff", str(log("diff_a")), str(log(f"diff_{variant}"))])
    assert result.exit_code == status
    assert result.stdout == diff_text(diff(log("diff_a"), log(f"diff_{variant}"))) + "\n"
    assert result.stderr == ""


def test_cli_json_and_options() -> None:
    result = CliRunner().invoke(cli, ["diff", str(log("diff_a")), str(log("diff_lr")), "--json",
                                      "--step", "0", "--rtol", "0.01", "--atol", "0"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert (data["differ"], data["steps"], data["rtol"]) == (False, [0], 0.01)


@pytest.mark.parametrize(("args", "message"), [
    (["diff_a", "missing"], "no such log"),
    (["crash", "crash"], "have no step in common"),
    (["diff_a", "diff_lr", "--step", "9"], "step 9 is not in both logs"),
    (["gan", "gan", "--model", "critic"], "no model 'critic'"),
])
def test_cli_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["diff", str(log(args[0])), str(log(args[1])), *args[2:]])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("hooktrace: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_cli_negative_tolerance_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["diff", str(log("diff_a")), str(log("diff_a")), "--rtol",
                                      "-1"])
    assert result.exit_code == 2
    assert "--rtol" in result.stderr

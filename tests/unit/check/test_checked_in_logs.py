"""``check`` on every real log checked in under tests/unit/logs: the exact findings (kind,
severity, model, module, step), what the report says it read, and the CLI's text, JSON and exit
status agreeing with the library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import NOTE, SEVERITY_ORDER
from hooktrace.check.report import to_json, to_text
from hooktrace.cli import cli
from hooktrace.log.errors import HooktraceError
from unit.logs import LOGS

Found = tuple[str, str, str, str, int | None]  # kind, severity, model, module, step

#: per checked-in log: (steps, events) the report says it read, and its findings in order
EXPECTED: dict[str, tuple[int, int, list[Found]]] = {
    "crash": (0, 0, [("script-error", "error", "", "", None)]),
    "dead_relu": (3, 36, [("dead-activation", "warning", "model", "act2", 0)]),
    "detached": (3, 42, [("no-grad", "warning", "model", "", 0)]),
    "diff_a": (5, 50, []),
    "diff_extra": (5, 60, []),
    "diff_lr": (5, 50, []),
    "diff_nan": (5, 50, [("nonfinite-forward", "error", "model", "poison", 3),
                         ("nonfinite-backward", "error", "model", "", 3)]),
    "diff_nostats": (3, 30, []),
    "diff_rename": (5, 50, []),
    "diff_swap": (5, 45, []),
    "diff_twice": (5, 60, [("called-several-times", "note", "model", "act", None)]),
    "eval_mode": (6, 84, [("eval-backward", "warning", "model", "", 3)]),
    "exploding": (3, 192, [("exploding", "warning", "model", "layers.0", 0)]),
    "frozen": (3, 36, [("frozen", "warning", "model", "layers.2", None)]),
    "gan": (4, 80, [("called-several-times", "note", "discriminator", "0", None),
                    ("called-several-times", "note", "criterion", "", None)]),
    "long_run": (60, 20, [("nonfinite-forward", "error", "model", "norm", 50),
                          ("nonfinite-backward", "error", "model", "", 50)]),
    "mnist": (3, 42, []),
    "nan_layer": (5, 50, [("nonfinite-forward", "error", "model", "compress", 3),
                          ("nonfinite-backward", "error", "model", "", 3)]),
    "ops": (3, 42, [("no-grad", "warning", "model", "", 0)]),
    "stale_optimizer": (4, 56, [("not-optimized", "warning", "model", "", None)]),
    "unused": (3, 30, [("unused", "warning", "model", "aux_head", None)]),
    "vae": (2, 24, []),
}
NAMES = sorted(EXPECTED)
HEALTHY = [n for n in NAMES if not any(f[1] != NOTE for f in EXPECTED[n][2])]


def log(name: str) -> Path:
    return LOGS / f"{name}.jsonl"


def test_every_checked_in_log_is_expected() -> None:
    """A log added under logs/ gets its findings written down here."""
    assert sorted(p.stem for p in LOGS.glob("*.jsonl")) == NAMES


def test_the_healthy_logs_are_the_clean_runs() -> None:
    assert HEALTHY == ["diff_a", "diff_extra", "diff_lr", "diff_nostats", "diff_rename",
                       "diff_swap", "diff_twice", "gan", "mnist", "vae"]


@pytest.mark.parametrize("name", NAMES)
def test_findings_exactly(name: str) -> None:
    report = run_checks(log(name))
    got = [(f.cause, f.severity, f.model, f.module, f.step) for f in report.findings]
    assert got == EXPECTED[name][2]


@pytest.mark.parametrize("name", NAMES)
def test_what_the_report_read(name: str) -> None:
    report = run_checks(log(name))
    steps, events, found = EXPECTED[name]
    assert (report.steps, report.events) == (steps, events)
    assert report.warnings == []  # each ended with its end record
    assert report.captured is None
    assert len(report.problems) == sum(f[1] != NOTE for f in found)


@pytest.mark.parametrize("name", NAMES)
def test_cli_json_matches_the_library_and_the_exit_status(name: str) -> None:
    result = CliRunner().invoke(cli, ["check", str(log(name)), "--json"])
    data = json.loads(result.stdout)
    report = run_checks(log(name))
    assert data == json.loads(to_json(report))
    assert list(data) == ["problems", "steps", "events", "warnings", "findings", "models"]
    problems = sum(f["severity"] != NOTE for f in data["findings"])
    assert data["problems"] == problems
    assert result.exit_code == (1 if problems else 0)
    for f in data["findings"]:
        assert list(f) == ["kind", "cause", "severity", "model", "module", "step", "message",
                           "evidence", "hint", "ranks", "source"]
        assert f["ranks"] is None  # one log: nothing rank-local
        assert f["message"]


@pytest.mark.parametrize("name", NAMES)
def test_cli_text_lists_errors_then_warnings_then_notes(name: str) -> None:
    result = CliRunner().invoke(cli, ["check", str(log(name))])
    text = result.stdout
    steps, events, found = EXPECTED[name]
    lines = text.splitlines()
    assert lines[0] == (f"hooktrace check {log(name)}: {steps} step{'s' * (steps != 1)}, "
                        f"{events} event{'s' * (events != 1)}")
    headings = [line.split(" (")[0] for line in lines if line in {
        f"{title} ({sum(f[1] == sev for f in found)})"
        for title, sev in (("Errors", "error"), ("Warnings", "warning"), ("Notes", "note"))}]
    want = [title for title, sev in (("Errors", "error"), ("Warnings", "warning"),
                                     ("Notes", "note")) if any(f[1] == sev for f in found)]
    assert headings == want
    kinds = [line.split("]")[0].strip()[1:] for line in lines if line.startswith("  [")]
    assert kinds == [f[0] for f in found]
    assert sorted(found, key=lambda f: SEVERITY_ORDER[f[1]]) == found
    errors = sum(f[1] == "error" for f in found)
    warnings = sum(f[1] == "warning" for f in found)
    notes = len(found) - errors - warnings
    if errors + warnings:
        assert f"({errors} error" in lines[-1] and f"{warnings} warning" in lines[-1]
        assert lines[-1].endswith(f"{notes} note" + ("" if notes == 1 else "s"))
    else:
        assert lines[-1] == f"No problems found ({notes} note{'' if notes == 1 else 's'})."
    assert text.rstrip("\n") == to_text(run_checks(log(name)), str(log(name)))


# -- what each defect's finding says -----------------------------------------------------------

@pytest.mark.parametrize("name", ["detached", "ops"])
def test_detached_branch_names_the_operation_and_its_line(name: str) -> None:
    (f,) = run_checks(log(name)).findings
    assert f.evidence["starved"] == ["branch_b.0", "branch_b.2"]
    assert f.evidence["steps"] == [0, 1, 2]
    assert f.evidence["op"]["op"] == ".detach()"
    assert f.evidence["op"]["line"] == "detached_branch.py:26"
    assert "rerun" not in f.evidence  # the zoomed calls answered
    assert f.source == "detached_branch.py:24 (TwoBranch.forward)"
    assert "the output of branch_b gets no gradient back, at .detach()" in f.message
    text = to_text(run_checks(log(name)), name)
    assert "    at: detached_branch.py:26: b = self.branch_b(x).detach()" in text


def test_dead_relu_is_named_not_its_victims() -> None:
    (f,) = run_checks(log("dead_relu")).findings
    assert f.evidence["starved"] == ["fc1", "fc2"]
    assert f.evidence["grad_input_norm"] == 0.0
    assert f.evidence["grad_output_norm"] > 0
    assert f.source == "dead_relu.py:29 (Classifier.forward)"
    assert f.message.startswith("act2 (ReLU): ")


@pytest.mark.parametrize(("name", "module", "nan", "shape"), [
    ("nan_layer", "compress", 245, [8, 32]), ("diff_nan", "poison", 64, [4, 16])])
def test_first_nan_names_the_module_and_its_outputs(name: str, module: str, nan: int,
                                                     shape: list[int]) -> None:
    forward, backward = run_checks(log(name)).findings
    assert forward.evidence["outputs"] == [
        {"index": 0, "shape": shape, "dtype": "float32", "nan": nan, "inf": 0}]
    assert f"--ops {module} --ops '{module}.*'" in forward.evidence["rerun"]
    assert "(again in step 4)" in forward.message
    assert backward.evidence["follows"] == "nonfinite-forward"
    assert backward.evidence["produced"] is False
    assert backward.hint == "fix the forward NaN/Inf first"


def test_nan_in_a_watched_step_is_found_from_its_anomaly_records() -> None:
    forward, backward = run_checks(log("long_run")).findings
    assert forward.evidence["outputs"] == [{"index": 0, "nan": 33, "inf": 31}]
    assert forward.evidence["modules_with_nonfinite_outputs"] == 2
    assert "again in steps 51, 52, 53, 54, 55 and 4 more" in forward.message
    assert "--steps 50" in forward.evidence["rerun"]
    assert backward.evidence == {"call": 0, "produced": False, "follows": "nonfinite-forward"}


def test_eval_mode_names_the_layers_that_act_differently() -> None:
    (f,) = run_checks(log("eval_mode")).findings
    assert f.evidence == {"layers": ["1", "3"]}
    assert "from step 3 on" in f.message


def test_exploding_profile_runs_from_the_output_to_the_input() -> None:
    (f,) = run_checks(log("exploding")).findings
    profile = [p["module"] for p in f.evidence["profile"]]
    assert profile[0] == "layers.29" and profile[-1] == "layers.0"
    norms = [p["grad_output_norm"] for p in f.evidence["profile"]]
    assert norms[-1] / norms[0] > 1e4
    assert len(f.evidence["grad_norm"]) == 30
    assert all(v > 1e4 for v in f.evidence["grad_norm"].values())


def test_frozen_unused_and_stale_optimizer_evidence() -> None:
    (frozen,) = run_checks(log("frozen")).findings
    assert frozen.evidence == {"params": 1056,
                               "trainable_siblings": ["layers.0", "layers.1", "layers.3"]}
    (unused,) = run_checks(log("unused")).findings
    assert unused.evidence == {"submodules": 0, "trainable": 66}
    (stale,) = run_checks(log("stale_optimizer")).findings
    assert stale.evidence == {"modules": ["features.0", "features.2", "head"]}


def test_crash_before_any_model_ran() -> None:
    (f,) = run_checks(log("crash")).findings
    assert f.evidence == {"error": "ValueError", "line": "raise_error.py:5"}
    assert f.message == ("the script stopped before any model ran, with ValueError "
                         "(raise_error.py:5): bad value 42")
    assert "  [script-error] before any model ran" in to_text(run_checks(log("crash")), "x")


def test_gan_notes_count_the_calls_per_step() -> None:
    disc, crit = run_checks(log("gan")).findings
    assert disc.evidence == {"modules": {"0": 2, "1": 2, "2": 2, "": 2}}
    assert crit.evidence == {"modules": {"": 2}}


# -- --step ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "step", "want"), [
    ("nan_layer", 0, []),
    ("nan_layer", 2, []),
    ("nan_layer", 3, [("nonfinite-forward", "compress", 3), ("nonfinite-backward", "", 3)]),
    ("nan_layer", 4, [("nonfinite-forward", "fc1", 4), ("nonfinite-backward", "", 4)]),
    ("diff_nan", 1, []),
    ("dead_relu", 1, [("dead-activation", "act2", 1)]),
    ("detached", 2, [("no-grad", "", 2)]),
    ("exploding", 1, [("exploding", "layers.0", 1)]),
    ("mnist", 0, []),
])
def test_step_restricts_the_findings(name: str, step: int,
                                     want: list[tuple[str, str, int]]) -> None:
    report = run_checks(log(name), step=step)
    assert [(f.cause, f.module, f.step) for f in report.findings] == want
    assert report.steps == 1


@pytest.mark.parametrize("step", [0, 1])
def test_step_of_a_gan_reports_no_problems(step: int) -> None:
    """The generator's forward runs in step 0, its backward in step 1: both are its step 0's."""
    assert run_checks(log("gan"), step=step).problems == []


def test_step_leaves_out_the_findings_of_other_steps() -> None:
    assert [f.step for f in run_checks(log("eval_mode"), step=0).findings] == []


@pytest.mark.parametrize("step", [3, 5])
def test_step_keeps_what_holds_from_an_earlier_step(step: int) -> None:
    """The model went into eval mode at step 3 and stayed there: steps 3 and 5 both say so."""
    report = run_checks(log("eval_mode"), step=step)
    assert [(f.cause, f.step) for f in report.findings] == [("eval-backward", 3)]
    assert report.steps == 1


def test_step_of_a_watched_anomaly() -> None:
    kinds = [f.cause for f in run_checks(log("long_run"), step=50).findings]
    assert kinds == ["nonfinite-forward", "nonfinite-backward"]
    assert run_checks(log("long_run"), step=1).findings == []


def test_step_of_a_watched_step_that_wrote_nothing_names_the_steps_the_log_has() -> None:
    with pytest.raises(HooktraceError, match=r"no step 30 in .*long_run.jsonl; its steps: "
                                             r"0-1, 50-59$"):
        run_checks(log("long_run"), step=30)


# -- thresholds ------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "want"), [
    ([], ["exploding"]),
    (["--exploding", "1e10"], ["exploding"]),  # the profile still grows 6.9 orders
    (["--orders", "7"], ["exploding"]),  # the parameter norms are still above 1e4
    (["--exploding", "1e10", "--orders", "7"], []),
])
def test_exploding_thresholds(args: list[str], want: list[str]) -> None:
    result = CliRunner().invoke(cli, ["check", str(log("exploding")), "--json", *args])
    data = json.loads(result.stdout)
    assert [f["cause"] for f in data["findings"]] == want
    assert result.exit_code == (1 if want else 0)


@pytest.mark.parametrize(("args", "want"), [
    (["--exploding", "0.01"], [("exploding", "conv1", 0)]),
    (["--orders", "0.5"], [("vanishing", "conv1", 0)]),
    (["--vanishing", "1e-2"], []),  # every norm of the healthy run is above it
    (["--vanishing", "1e-9", "--exploding", "1e9", "--orders", "9"], []),
])
def test_thresholds_move_findings_on_a_healthy_log(args: list[str],
                                                   want: list[tuple[str, str, int]]) -> None:
    result = CliRunner().invoke(cli, ["check", str(log("mnist")), "--json", *args])
    data = json.loads(result.stdout)
    assert [(f["cause"], f["module"], f["step"]) for f in data["findings"]] == want
    assert result.exit_code == (1 if want else 0)

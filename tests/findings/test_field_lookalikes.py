"""Healthy field programs that narrow rules took for bugs (issue 48), on real runs of
``hooktrace run`` (``tests/scripts/field_lookalikes.py``): judged by the passes that feed an
optimizer step (twin critics, Grad-CAM) and by whether a loss read a NaN (a FLOPs probe, a
masked terminal observation), each stays silent; the NaN a loss did read stays an error, and
a loss that goes up a thousandfold without NaN is said from the loss ledger, a layer that
never moves from the parameter ledger; a hinge loss of exactly 0 explains its zero gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Cases, Shared, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "field_lookalikes.py"
HEALTHY = ["twin_critics", "metric_copy", "gradcam", "flops_probe", "nan_next_obs",
           "frozen_last_layer", "rises_then_falls", "hinge_met"]
BUGS = ["bug_nan_next_obs", "bug_lr_too_high", "bug_grad_cleared", "bug_bias_left_out"]


@pytest.fixture(scope="module")
def cases(shared: Shared) -> Cases:
    return run_cases(shared, "field_lookalikes", [*HEALTHY, *BUGS],
                     lambda case: SCRIPT)


@pytest.mark.parametrize("case", HEALTHY)
def test_a_healthy_program_is_silent(cases: Cases, case: str) -> None:
    status, found = run_findings(cases[case])
    assert [(f["cause"], f["module"]) for f in found if f["severity"] != "note"] == []
    assert status == 0


def test_a_nan_from_the_data_that_no_loss_read_is_a_note(cases: Cases) -> None:
    _, found = run_findings(cases["nan_next_obs"])
    [nan] = [f for f in found if f["cause"] == "nonfinite-forward"]
    assert (nan["kind"], nan["severity"], nan["model"]) == ("nonfinite", "note", "target_net")
    assert "no loss that trains read it" in nan["message"]


def test_a_nan_from_the_data_that_the_loss_read_is_an_error(cases: Cases) -> None:
    status, found = run_findings(cases["bug_nan_next_obs"])
    assert status == 1
    assert {(f["cause"], f["severity"], f["model"]) for f in found} >= {
        ("nonfinite-forward", "error", "target_net"), ("nonfinite-backward", "error", "q_net")}


def test_a_loss_that_diverges_without_nan_is_said(cases: Cases) -> None:
    status, found = run_findings(cases["bug_lr_too_high"])
    assert status == 1
    [diverged] = [f for f in found if f["severity"] != "note"]
    assert (diverged["kind"], diverged["cause"], diverged["model"], diverged["step"]) == (
        "loss", "loss-diverged", "model", 1)


@pytest.mark.parametrize(("case", "cause", "module"), [
    ("bug_grad_cleared", "grads-cleared", "3"), ("bug_bias_left_out", "not-optimized", "3")])
def test_a_parameter_that_never_moves_is_said_with_why(cases: Cases, case: str, cause: str,
                                                        module: str) -> None:
    status, found = run_findings(cases[case])
    assert status == 1
    assert [(f["kind"], f["cause"], f["module"]) for f in found if f["severity"] != "note"] == [
        ("update", cause, module)]

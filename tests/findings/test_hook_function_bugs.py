"""``check`` on hooks that pile up and custom autograd code (issue 36, item 3;
``scripts/hook_function_cases.py``, real runs of ``hooktrace run``): a hook registered every
step is ``hooks-growing``; a custom ``autograd.Function`` whose backward disagrees with a
finite-difference estimate of its forward is ``function-backward``. The look-alikes: a hook
registered per epoch and removed, a correct Function with a kink used where inputs sit on it,
a straight-through estimator and a gradient multiplier (their backward differs from the
forward's gradient on purpose: a note, not a problem)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Run, Shared, problems, run_cases, run_findings, script_cases

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "hook_function_cases.py"

BUGS: dict[str, list[tuple[Any, ...]]] = {
    "backward_hook_every_step": [("hooks-growing", "warning", "model", "head", 0)],
    "sigmoid_backward_wrong": [("function-backward", "warning", "model", "", 0)],
}
# healthy look-alikes -> the verdict of the note they get (None: no function-backward note)
HEALTHY: dict[str, str | None] = {
    "ok_hook_per_epoch_removed": None,
    "ok_function_with_kink": None,
    "ok_straight_through": "surrogate",
    "ok_grad_multiply": "modifier",
}


def test_the_cases_are_the_script_s() -> None:
    assert script_cases(SCRIPT) == [*BUGS, *HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "hookfn", [*BUGS, *HEALTHY], lambda case: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_bug_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == BUGS[case]
    assert status == 1


def test_the_wrong_backward_names_the_function_and_its_line(runs: dict[str, Run]) -> None:
    _, found = run_findings(runs["sigmoid_backward_wrong"])
    (f,) = [f for f in found if f["cause"] == "function-backward"]
    assert "SigmoidWrong (" in f["message"] and "hook_function_cases.py:" in f["message"]
    assert f["evidence"]["verdict"] == "mismatch"


def test_the_growing_hooks_say_their_counts(runs: dict[str, Run]) -> None:
    _, found = run_findings(runs["backward_hook_every_step"])
    assert found[0]["evidence"]["hooks"] == "backward"
    assert found[0]["evidence"]["counts"] == [1, 2, 3]


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0
    notes = [f["evidence"]["verdict"] for f in found if f["cause"] == "function-backward"]
    assert notes == ([HEALTHY[case]] if HEALTHY[case] else [])

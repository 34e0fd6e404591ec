"""The step, explained on hand-built logs: each ``step-unexplained`` signal one warning that says
which expectation of the step broke and where; an expectation this checker does not know, none;
an optimizer's learning rates that fall by a constant factor (``lr-collapsed``) say it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .logbuild import findings, healthy, signal, write_log

# expectation -> (its detail, the signal's module, words of the message, words of the hint)
CASES: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "group-lr": ({"optimizer": "AdamW", "group": 1, "steps": [0, 1, 2], "count": 3,
                  "others": 0.001, "modules": ["fc1"]}, "fc1",
                 "param group 1 of the AdamW optimizer of model 'net' (fc1) stepped at lr 0 in "
                 "all 3 steps it had gradients in, while another group of it stepped at lr "
                 "0.001", "requires_grad_(False)"),
    "state": ({"optimizer": "Adam", "steps": [1, 2], "count": 2}, "",
              "a new Adam optimizer took over the parameters of model 'net' 2 times ("
              "steps 1, 2)", "build the optimizer once"),
    "cleared": ({"windows": 3, "passes": 2, "modules": ["fc1", "fc2"]}, "fc1",
                "the gradients of model 'net' (fc1, fc2) were cleared between backward passes "
                "of one accumulation: 2 passes before one optimizer step began from no gradient "
                "(3 accumulations so)", "not inside the micro-batch loop"),
    "sign": ({"steps": [0, 1], "factor": -0.25, "modules": ["fc1"]}, "fc1",
             "multiplied by a negative factor (-0.25) between backward() and optimizer.step() "
             "in 2 steps (steps 0, 1): the step moves the weights along +g", "negative max_norm"),
}


@pytest.mark.parametrize("expectation", sorted(CASES))
def test_each_expectation_is_one_warning(tmp_path: Path, expectation: str) -> None:
    detail, module, says, hint = CASES[expectation]
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("step-unexplained", 1, module, expectation=expectation, **detail)])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == (
        "step-unexplained", "warning", "net", module, 1)
    assert says in f.message
    assert hint in (f.hint or "")
    assert f.evidence["expectation"] == expectation


# (verdict, cause) of an ``update`` signal -> words of the message, words of the hint
UPDATES: dict[tuple[str, str], tuple[str, str]] = {
    ("reversed", "lr"): ("the SGD optimizer of model 'net' (fc1) stepped at a negative learning "
                         "rate (-0.05) in 3 of 4 recorded steps (steps 2, 3, 4): each step "
                         "moved the weights along +g", "max(0.0, ...)"),
    ("reversed", "maximize"): ("the SGD optimizer of model 'net' (fc1) was built with "
                               "maximize=True", "drop maximize=True"),
    ("reversed", "custom"): ("the SGD optimizer of model 'net' (fc1) moved the weights along +g "
                             "in 3 of 4 recorded steps (steps 2, 3, 4) (cosine -0.90 with -g)",
                             "alpha=-lr"),
    ("reversed", ""): ("moved the weights against the update its kind makes of their gradient, "
                       "lr and state (cosine -0.90) in 3 of 4", "a step hook"),
    ("still", ""): ("did not move the weights though its lr and their gradient say it should",
                    "copies of the parameters"),
    ("scaled", ""): ("moved the weights by 500 times the update its kind makes", "a step hook"),
}


@pytest.mark.parametrize("verdict", sorted(UPDATES))
def test_each_update_verdict_is_one_warning(tmp_path: Path, verdict: tuple[str, str]) -> None:
    says, hint = UPDATES[verdict]
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("step-unexplained", 2, "fc1", expectation="update", optimizer="SGD",
               verdict=verdict[0], cause=verdict[1], steps=[2, 3, 4], count=3, judged=4,
               lr=-0.05, cosine=-0.9, ratio=500.0, modules=["fc1"])])
    (f,) = findings(path)
    assert (f.cause, f.module, f.step, f.evidence["verdict"]) == (
        "step-unexplained", "fc1", 2, verdict[0])
    assert says in f.message
    assert hint in (f.hint or "")


def test_an_unknown_expectation_says_nothing(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("step-unexplained", 0, expectation="future")])
    assert findings(path) == []


def test_a_collapse_by_one_factor_says_it(tmp_path: Path) -> None:
    lrs = [0.1 * 0.05 ** max(i - 1, 0) for i in range(7)]  # StepLR(step_size=1), per batch
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("optimizer-lrs", 0, optimizer="SGD", models=[0], count=7, every=1,
               after=list(range(7)), lr=lrs)])
    (f,) = findings(path)
    assert ("the learning rate of the optimizer of model 'net', multiplied by 0.05 at every "
            "optimizer step, fell below 1e-4 of its peak (0.1) at step 5") in f.message
    assert f.evidence["factor"] == pytest.approx(0.05)

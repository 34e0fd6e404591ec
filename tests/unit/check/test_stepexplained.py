"""The step, explained on hand-built logs: the facts of ``optimizer-steps`` and ``step-sample``
signals, one warning per expectation of the step that they show broken, saying which and where;
the same facts under the thresholds (one step, a group that moved later, optimizers in turns,
a move contradicted in fewer than half of the steps judged), none; an optimizer's learning rates
that fall by one constant factor (``lr-collapsed``) say it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .logbuild import findings, healthy, signal, write_log

STEPS = {"optimizer": "AdamW", "count": 3, "after": [0, 1, 2], "lr": [0.001] * 3,
         "moving": 0, "held": ["fc1", "fc2"]}
ZERO = {"group": 1, "steps": [0, 1, 2], "count": 3, "others": 0.001, "moved": False,
        "modules": ["fc1"]}


def rebuilt(step: int, **more: Any) -> Any:
    return signal("optimizer-steps", step, **{**STEPS, "optimizer": "Adam", "count": 1,
                  "took_over": {"step": step, "steps": 1, "state": True}, **more})


# expectation -> (its signals, the finding's module and step, words of the message, of the hint)
CASES: dict[str, tuple[list[Any], str, int, str, str]] = {
    "group-lr": ([signal("optimizer-steps", 0, **STEPS, zero_lr=[ZERO])], "fc1", 0,
                 "param group 1 of the AdamW optimizer of model 'net' (fc1) stepped at lr 0 in "
                 "all 3 steps it had gradients in, while another group of it stepped at lr "
                 "0.001", "requires_grad_(False)"),
    "state": ([rebuilt(1), rebuilt(2)], "", 1,
              "a new Adam optimizer took over the parameters of model 'net' 2 times ("
              "steps 1, 2)", "build the optimizer once"),
    "cleared": ([signal("step-sample", 1, "fc1", modules=["fc1", "fc2"],
                        cleared=[[1, 4, 0], [2, 3, 1]])], "fc1", 1,
                "the gradients of model 'net' (fc1, fc2) were cleared between backward passes "
                "of one accumulation: 2 passes before one optimizer step began from no gradient "
                "(3 accumulations so)", "not inside the micro-batch loop"),
    "sign": ([signal("step-sample", 0, "fc1", modules=["fc1"], flips={
        "steps": [0, 1], "count": 2, "factor": -0.25})], "fc1", 0,
             "multiplied by a negative factor (-0.25) between backward() and optimizer.step() "
             "in 2 steps (steps 0, 1): the step moves the weights along +g", "negative max_norm"),
}


@pytest.mark.parametrize("expectation", sorted(CASES))
def test_each_expectation_is_one_warning(tmp_path: Path, expectation: str) -> None:
    signals, module, step, says, hint = CASES[expectation]
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=signals)
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == (
        "step-unexplained", "warning", "net", module, step)
    assert says in f.message
    assert hint in (f.hint or "")
    assert f.evidence["expectation"] == expectation


@pytest.mark.parametrize("signals", [
    [signal("optimizer-steps", 0, **STEPS, zero_lr=[{**ZERO, "moved": True}])],
    [signal("optimizer-steps", 0, **STEPS, zero_lr=[{**ZERO, "count": 1, "steps": [0]}])],
    [rebuilt(1), rebuilt(2, resumed=True)],
    [rebuilt(1), signal("optimizer-steps", 2, **{**STEPS, "took_over": {
        "step": 2, "steps": 40, "state": True}})],
    [signal("step-sample", 1, "fc1", modules=["fc1"], cleared=[[1, 9, 0]])],
    [signal("step-sample", 1, "fc1", modules=["fc1"], flips={
        "steps": [3], "count": 1, "factor": -1.0})],
    [signal("optimizer-steps", 0, **STEPS, again={"steps": [1, 2], "count": 2, "most": 2,
                                                  "of": 9})],
], ids=["moved-later", "once", "in-turns", "rebuilt-late", "cleared-once", "one-flip",
        "again-rarely"])
def test_facts_under_the_thresholds_say_nothing(tmp_path: Path, signals: list[Any]) -> None:
    assert findings(write_log(tmp_path / "log.jsonl", healthy(), signals=signals)) == []


def test_an_optimizer_stepping_again_is_stepped_twice(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("optimizer-steps", 0, **STEPS, again={"steps": [1, 2], "count": 2, "most": 3,
                                                     "of": 3})])
    (f,) = findings(path)
    assert (f.cause, f.step) == ("stepped-twice", 1)
    assert "stepped 3 times after one backward pass, in steps 1, 2" in f.message


# (verdict, cause) -> a judged step's facts [cosine, ratio, lr, moved, ascent], words of the
# message, words of the hint
UPDATES: dict[tuple[str, str], tuple[list[Any], str, str]] = {
    ("reversed", "lr"): ([0.9, 1.0, -0.05, True, "lr"],
                         "the SGD optimizer of model 'net' (fc1) stepped at a negative learning "
                         "rate (-0.05) in 3 of 4 recorded steps (steps 2, 3, 4): each step "
                         "moved the weights along +g", "max(0.0, ...)"),
    ("reversed", "maximize"): ([0.9, 1.0, 0.05, True, "maximize"],
                               "the SGD optimizer of model 'net' (fc1) was built with "
                               "maximize=True", "drop maximize=True"),
    ("reversed", "custom"): ([-0.9, 0.0, 0.05, True, "custom"],
                             "the SGD optimizer of model 'net' (fc1) moved the weights along "
                             "+g in 3 of 4 recorded steps (steps 2, 3, 4) (cosine -0.90 with "
                             "-g)", "alpha=-lr"),
    ("reversed", ""): ([-0.9, 1.0, 0.05, True, ""],
                       "moved the weights against the update its kind makes of their gradient, "
                       "lr and state (cosine -0.90) in 3 of 4", "a step hook"),
    ("still", ""): ([0.0, 0.0, 0.05, False, ""],
                    "did not move the weights though its lr and their gradient say it should",
                    "copies of the parameters"),
    ("scaled", ""): ([1.0, 500.0, 0.05, True, ""],
                     "moved the weights by 500 times the update its kind makes", "a step hook"),
}


@pytest.mark.parametrize("verdict", sorted(UPDATES))
def test_each_update_verdict_is_one_warning(tmp_path: Path, verdict: tuple[str, str]) -> None:
    fact, says, hint = UPDATES[verdict]
    healthy_step = [1, 1.0, 1.0, 0.05, True, fact[-1] if fact[-1] == "custom" else ""]
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("step-sample", 1, "fc1", modules=["fc1"], moves=[{
            "optimizer": "SGD", "judged": 4, "modules": ["fc1"],
            "steps": [healthy_step] + [[step, *fact] for step in (2, 3, 4)]}])])
    (f,) = findings(path)
    assert (f.cause, f.module, f.step, f.evidence["verdict"], f.evidence["cause"]) == (
        "step-unexplained", "fc1", 2, *verdict)
    assert says in f.message
    assert hint in (f.hint or "")


def test_a_move_contradicted_in_under_half_the_steps_says_nothing(tmp_path: Path) -> None:
    steps = [[step, 1.0, 1.0, 0.05, True, ""] for step in range(5)]
    steps += [[step, -0.9, 1.0, 0.05, True, ""] for step in (5, 6)]
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("step-sample", 1, "fc1", modules=["fc1"], moves=[{
            "optimizer": "SGD", "judged": 7, "modules": ["fc1"],
            "steps": steps}])])
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

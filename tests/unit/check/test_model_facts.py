"""The Models block's facts (``check/models.py``) on hand-built logs of two models: a model
frozen from a step on, one unfrozen at a step, a part of a model frozen (no fact: the model
still trains), a twin known by its variable only; and the report: the block before the
findings, capped, never a problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import Report
from hooktrace.check.models import ModelFacts
from hooktrace.check.report import MODELS_SHOWN, to_json, to_text
from hooktrace.log import schema

from .logbuild import CHAIN, C, chain, signal, write_log

STEPS = 4


def steps() -> list[list[C]]:
    """Each step: the trained model ``net`` (model 0), then ``other`` (model 1) under no_grad."""
    return [[*chain(), *(C(n, g_out=None, g_in=None, no_grad=True, model=1)
                        for n in ("fc1", "act", "fc2", ""))] for _ in range(STEPS)]


def texts(tmp_path: Path, signals: list[schema.Signal], other: list[tuple[Any, ...]] | None = None
          ) -> list[str]:
    sgd = signal("optimizer-steps", 0, optimizer="SGD", count=STEPS, after=list(range(STEPS)))
    path = write_log(tmp_path / "log.jsonl", steps(), signals=[sgd, *signals],
                     others=[("other", other or CHAIN)])
    return [m.text for m in run_checks(path).models]


TRAINED = "net (Net): trained by SGD after every backward pass"
EVALUATED = "evaluated only, under torch.no_grad"


def test_a_model_frozen_from_a_step_on(tmp_path: Path) -> None:
    frozen = signal("trainable-changed", 2, frozen=["fc1", "fc2"], unfrozen=[])
    assert texts(tmp_path, [frozen]) == [f"{TRAINED}; frozen from step 2 on",
                                         f"other (Net): stepped by no optimizer; {EVALUATED}"]


def test_a_model_unfrozen_at_a_step(tmp_path: Path) -> None:
    unfrozen = signal("trainable-changed", 1, model=1, frozen=[], unfrozen=["fc1", "fc2"])
    frozen_at_first = [("", "Net", 0), ("fc1", "Linear", 40, 0), ("act", "ReLU", 0),
                       ("fc2", "Linear", 18, 0)]
    assert texts(tmp_path, [unfrozen], frozen_at_first) == [
        TRAINED, f"other (Net): stepped by no optimizer; frozen until step 0, trainable after; "
        f"{EVALUATED}"]


def test_part_of_a_model_frozen_is_no_fact_of_the_model(tmp_path: Path) -> None:
    partly = signal("trainable-changed", 2, frozen=["fc1"], unfrozen=[])
    assert texts(tmp_path, [partly])[0] == TRAINED


def test_a_twin_known_by_its_variable_only(tmp_path: Path) -> None:
    looks = [signal("twins", s, models=["net", "ema"], same=[["net", "ema"]] if s == 0 else [],
                    changed=[] if s == 0 else ["net", "ema"], unchanged=[],
                    trained=[] if s == 0 else ["net"]) for s in range(STEPS)]
    assert texts(tmp_path, looks)[-1] == (
        "ema: a moving average of net (started as its copy, changed at every step, stepped by "
        "no optimizer); never called")


def facts(n: int) -> list[ModelFacts]:
    return [ModelFacts(f"m{i}", "Net", text=f"m{i} (Net): trained by SGD") for i in range(n)]


def test_the_block_comes_before_the_findings_and_is_no_problem() -> None:
    lines = to_text(Report([], [], 3, 24, models=facts(2)), "x").splitlines()
    assert lines == ["hooktrace check x: 3 steps, 24 events", "", "Models (2)",
                     "  m0 (Net): trained by SGD", "  m1 (Net): trained by SGD", "",
                     "No problems found (0 notes)."]


@pytest.mark.parametrize("n", [MODELS_SHOWN, MODELS_SHOWN + 3])
def test_many_models_are_capped_in_text_and_all_in_json(n: int) -> None:
    report = Report([], [], 3, 24, models=facts(n))
    lines = to_text(report, "x").splitlines()
    shown = [line for line in lines if line.startswith("  m")]
    assert len(shown) == min(n, MODELS_SHOWN)
    more = [line for line in lines if line.startswith("  ...")]
    said = "  ... and 3 more models (--json lists them all)"
    assert more == ([] if n <= MODELS_SHOWN else [said])
    assert [m["model"] for m in json.loads(to_json(report))["models"]] == [
        f"m{i}" for i in range(n)]


def test_a_model_called_only_in_watched_steps_is_not_said_never_called(tmp_path: Path) -> None:
    """Its model record says it was called; the recorded steps hold none of its calls (an
    evaluation every 100 steps, after the recorded ones): nothing is claimed of those calls."""
    sgd = signal("optimizer-steps", 0, optimizer="SGD", count=STEPS, after=list(range(STEPS)))
    path = write_log(tmp_path / "log.jsonl", [chain() for _ in range(STEPS)], signals=[sgd],
                     others=[("other", CHAIN)])
    assert [m.text for m in run_checks(path).models] == [
        TRAINED, "other (Net): stepped by no optimizer; called only in steps not recorded (run "
        "--steps to record one of them)"]

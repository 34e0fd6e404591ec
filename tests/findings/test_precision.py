"""Precision. The first NaN/Inf of a forward, told by the module's own weights: weights that an
update made NaN/Inf from finite gradients (float16 weights with Adam's eps=1e-8, an update that
overflowed), weights that came NaN, and silence on the weights where the NaN came from the data.
Float16 gradients that underflow to exactly zero without a loss scaler, and a float16 zero that
is not one. Half-precision weights whose updates round away, and ones that train. Real runs of
``hooktrace run``, recorded and watched steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import hooktrace_cmd

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def findings(tmp_path: Path, script: str, case: str, *options: str) -> list[dict[str, Any]]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", "-o", log, *options, SCRIPTS / script, case)
    assert run.returncode == 0, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return list(json.loads(result.stdout)["findings"])


def first_nan(tmp_path: Path, script: str, case: str, *options: str) -> dict[str, Any]:
    [found] = [f for f in findings(tmp_path, script, case, *options)
               if f["cause"] == "nonfinite-forward"]
    return found


@pytest.mark.parametrize("steps", ["0:10", "0:1"])  # step 1 recorded, or watched
def test_float16_weights_an_adam_step_made_nan(tmp_path: Path, steps: str) -> None:
    found = first_nan(tmp_path, "blind_bugs4.py", "adam_eps_fp16", "--steps", steps)
    assert (found["module"], found["step"]) == ("0", 1)
    assert found["message"].endswith(
        ": its own weights (weight, bias) already held NaN/Inf when it ran, though every "
        "gradient before was finite: the update after step 0 made them so")
    assert "Adam's eps=1e-8 rounds to 0" in found["hint"]


def test_an_update_that_overflowed(tmp_path: Path) -> None:
    found = first_nan(tmp_path, "precision.py", "update_overflow")
    assert (found["module"], found["step"]) == ("0", 1)
    assert "the update after step 0 made them so" in found["message"]
    assert found["hint"].startswith("the update itself overflowed")


def test_weights_that_came_nan(tmp_path: Path) -> None:
    found = first_nan(tmp_path, "precision.py", "loaded_nan")
    assert (found["module"], found["step"]) == ("2", 0)
    assert found["message"].endswith(
        ": its own weights (weight) already held NaN/Inf when it ran, at the first step the log "
        "holds: they were initialised, loaded or changed so before it")


def test_nan_from_the_data_does_not_blame_the_weights(tmp_path: Path) -> None:
    # step 2's batch holds a NaN; the weights are finite until step 2's update
    found = first_nan(tmp_path, "precision.py", "data_nan")
    assert (found["module"], found["step"]) == ("0", 2)
    assert "weights" not in found["message"] and "weights" not in found["evidence"]


def test_float16_gradients_that_underflow_without_a_scaler(tmp_path: Path) -> None:
    [found] = findings(tmp_path, "blind_bugs4.py", "fp16_underflow")
    assert (found["cause"], found["severity"], found["module"]) == ("zero-gradient", "warning", "0")
    assert found["message"].endswith(
        "; the gradient reaching the float16 output of model 'model' is already exactly zero, "
        "and no loss scaler scales the loss: its gradients fall below float16's smallest value "
        "(6e-8) and round to 0")
    assert "torch.amp.GradScaler" in found["hint"]


def test_a_float16_zero_from_a_zero_layer_is_not_an_underflow(tmp_path: Path) -> None:
    found = findings(tmp_path, "precision.py", "fp16_zero_head")
    assert [(f["cause"], f["severity"], f["module"]) for f in found] == [
        ("zero-gradient", "note", "2")]
    assert "float16" not in found[0]["message"] and "its weights are zero" in found[0]["message"]


@pytest.mark.parametrize(("script", "case"), [("blind_bugs4.py", "bf16_weights_stall"),
                                              ("precision.py", "bf16_sgd_tiny")])
def test_bfloat16_weights_whose_updates_round_away(tmp_path: Path, script: str,
                                                   case: str) -> None:
    [found] = findings(tmp_path, script, case)
    assert (found["cause"], found["severity"], found["model"], found["step"]) == (
        "updates-rounded", "warning", "model", 0)
    assert found["message"].startswith(
        "the bfloat16 weights of model 'model' barely change: from step 0 to step 2, ")
    assert found["message"].endswith(
        "sampled weights with a non-zero gradient moved: each update (learning rate 0.0001) is "
        "below a bfloat16 weight's precision and rounds back to it")
    assert found["evidence"]["moved"] < 0.25 * found["evidence"]["compared"]


def test_bfloat16_weights_that_train_are_not_said(tmp_path: Path) -> None:
    assert findings(tmp_path, "precision.py", "bf16_adam") == []

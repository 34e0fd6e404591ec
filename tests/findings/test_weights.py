"""``weights-unchanged``: a model whose weights got gradients and never changed, named with the
cause (no optimizer.step(), a learning rate of 0 or too small for float32), on real runs of
``hooktrace run``; and silence where the weights do change late or by hand (a warmup from 0,
gradient accumulation, a manual update, Adam at 1e-6) or nothing trains (an analysis, gradients
summed and never cleared with no optimizer)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import hooktrace_cmd

from hooktrace.observe.ledger import bit_sums

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "weights_loop.py"


def check_case(tmp_path: Path, case: str, *run_args: str) -> list[dict[str, Any]]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", *run_args, "-o", log, SCRIPT, case)
    assert run.returncode == 0, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return [f for f in json.loads(result.stdout)["findings"] if f["severity"] != "note"]


# case -> (the step it is found at, the last step compared, the words of the cause, of the hint)
BUGS = {
    "no_step": (0, 4, "no optimizer.step() ran", "call optimizer.step() after loss.backward()"),
    "lr_zero": (0, 2, "the optimizer's learning rate is 0", "a learning rate above 0"),
    "lr_tiny": (0, 2, "the learning rate (1e-12) is too small to change float32 weights",
                "raise the learning rate"),
}


@pytest.mark.parametrize("case", sorted(BUGS))
def test_weights_that_never_change_are_named_with_their_cause(tmp_path: Path, case: str) -> None:
    step, through, cause, hint = BUGS[case]
    [finding] = check_case(tmp_path, case)
    assert (finding["cause"], finding["severity"], finding["model"], finding["module"],
            finding["step"]) == ("weights-unchanged", "warning", "model", "", step)
    assert finding["message"] == (
        f"the weights of model 'model' did not change from step {step} to step {through} "
        f"though they got gradients (2 modules: 0, 2): {cause}")
    assert hint in finding["hint"]


@pytest.mark.parametrize("case", ["ok_warmup", "ok_accumulate", "ok_manual_sgd", "ok_small_lr",
                                  "ok_gradients_summed"])
def test_weights_that_change_are_not_reported(tmp_path: Path, case: str) -> None:
    assert check_case(tmp_path, case) == []


def test_an_analysis_without_optimizer_is_not_told_to_step(tmp_path: Path) -> None:
    # input gradients of a model in eval mode: no optimizer to step, and eval mode changes
    # nothing in a model without norm or dropout layers
    assert check_case(tmp_path, "saliency") == []


def test_too_few_recorded_steps_decide_nothing(tmp_path: Path) -> None:
    # two recorded steps hold one optimizer step: a warmup's first may have a learning rate
    # of 0, so nothing is said
    assert check_case(tmp_path, "lr_zero", "--steps", "0:2") == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.complex64])
def test_one_ulp_in_one_element_changes_the_fingerprint(dtype: torch.dtype) -> None:
    # the fingerprint is exact: the smallest update an optimizer can make to one weight of
    # many, and an update that moves the norm by less than its rounding, are both seen
    weights = torch.randn(4096, dtype=torch.float64).to(dtype)
    for i in (0, 1777, 4095):
        nudged = weights.clone()
        real = torch.view_as_real(nudged) if dtype.is_complex else nudged
        flat = real.view(-1)
        flat[i] = torch.nextafter(flat[i], torch.tensor(math.inf, dtype=flat.dtype))
        assert bit_sums([weights]) != bit_sums([nudged])
    assert bit_sums([weights]) == bit_sums([weights.clone()])

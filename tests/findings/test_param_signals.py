"""``check`` on the parameter bugs the tracer signals (real runs of ``hooktrace run``): a weight
read through ``.data`` while its bias trains (``params-without-grad``), gradients zeroed
between backward and step (``grads-zeroed``), an ``nn.Parameter`` created in forward
(``params-recreated``); and silence on their healthy look-alikes (``scripts/param_signals.py``:
a frozen bias, LoRA adapters, tied weights, a buffer replaced at every call, a parameter built
lazily once, a loss multiplied by 0, gradient accumulation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Run, Shared, problems, run_cases, run_findings

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BLIND, LOOK_ALIKES = SCRIPTS / "blind_bugs.py", SCRIPTS / "param_signals.py"

# case -> (its problem (kind, severity, model, module, step), words of the message, of the hint)
BUGS: dict[str, tuple[tuple[Any, ...], str, str]] = {
    "data_in_forward": (
        ("no-grad", "warning", "model", "2", 0),
        "2 (NormedLinear): its weight never got a gradient though its bias did (from step 0 "
        "on): its forward uses it outside autograd (.data, .detach(), a copy)",
        "not self.weight.data"),
    "clip_zero": (
        ("grads-zeroed", "warning", "model", "backbone.0", 0),
        "found every gradient of model 'model' exactly zero, though its backward gave 3 "
        "modules (backbone.0, backbone.2, fc) non-zero ones", "clip_grad_norm_ with max_norm=0"),
    "zero_grad_between": (
        ("grads-zeroed", "warning", "model", "0", 0),
        "zeroed between backward() and step()", "zero_grad() between backward() and step()"),
    "param_in_forward": (
        ("params-recreated", "warning", "model", "0", 0),
        "0 (ScaledBlock) creates a new nn.Parameter 'scale' in its forward at every call: no "
        "optimizer holds it, and it restarts from its initial value each step", "in __init__"),
}
HEALTHY = ["ok_frozen_bias", "ok_lora", "ok_weight_tying", "ok_buffer_replaced", "ok_lazy_param",
           "ok_zero_loss_batch"]
BLIND_HEALTHY = ["ok_grad_accum"]
CASES = [*BUGS, *HEALTHY, *BLIND_HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    """Every case traced and checked once, two at a time."""
    def script(case: str) -> Path:
        return LOOK_ALIKES if case in HEALTHY or case == "zero_grad_between" else BLIND

    return run_cases(shared, "params", CASES, script)


def findings(runs: dict[str, Run], case: str) -> tuple[int, list[dict[str, Any]]]:
    return run_findings(runs[case])


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_module_and_the_cause_are_named(runs: dict[str, Run], case: str) -> None:
    status, found = findings(runs, case)
    problem, said, hint = BUGS[case]
    assert problems(found) == [problem]
    [finding] = [f for f in found if f["cause"] == problem[0]]
    assert said in finding["message"]
    assert hint in finding["hint"]
    assert status == 1


def test_the_parameters_are_the_evidence(runs: dict[str, Run]) -> None:
    _, found = findings(runs, "data_in_forward")
    assert found[0]["evidence"] == {"params": ["weight"], "with_grad": ["bias"]}
    _, found = findings(runs, "param_in_forward")
    assert found[0]["evidence"] == {"params": ["scale"]}


@pytest.mark.parametrize("case", HEALTHY + BLIND_HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = findings(runs, case)
    assert problems(found) == []
    assert status == 0

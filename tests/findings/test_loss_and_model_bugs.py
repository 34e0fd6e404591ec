"""``check`` on a third set of bugs written blind (``scripts/blind_bugs3.py``, real runs of
``hooktrace run``), judged before any fix: 8 of 12 named, 1 misnamed, 3 missed, 5 of 5 healthy
look-alikes silent. Two of the missed ones were in the log and are named since: a model ending
with a Softmax fed to ``nn.CrossEntropyLoss`` (``loss-input``), and an ``nn.MSELoss`` whose
target broadcasts against its input (``loss-broadcast``). Left as they are: a clamp that
saturates every output (named at the right module with a wrong cause) and a learnable
positional embedding made with ``register_buffer`` (the log has no buffers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Run, Shared, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "blind_bugs3.py"

# case -> its problems (kind, severity, model, module, step), in check's order
BUGS: dict[str, list[tuple[Any, ...]]] = {
    "encoder_hidden_detach": [("no-grad", "warning", "model", "", 0)],
    "nograd_helper": [("no-grad-under-no_grad", "warning", "model", "", 0)],
    "gan_gen_detached": [("never-reached", "error", "generator", "", None),
                         ("no-grad", "warning", "generator", "", 0)],
    # made in the VAE's own forward (sqrt of a negative variance), which dec.0 received
    "vae_sqrt_var_nan": [("nonfinite-forward", "error", "model", "", 0),
                         ("nonfinite-backward", "error", "model", "", 0)],
    "sqrt_pairwise_nan": [("nonfinite-backward", "error", "embedder", "", 0),
                          ("nonfinite-forward", "error", "embedder", "0", 1)],
    "python_list_layers": [("not-optimized", "warning", "model", "(blocks[0]).0", None)],
    "init_zeros": [("zero-gradient", "warning", "model", "4", 0)],
    "param_group_forgot_head": [("not-optimized", "warning", "model", "head", None)],
    "double_softmax_ce": [("loss-input", "warning", "model", "3", 0)],
    "mse_broadcast": [("loss-broadcast", "warning", "loss_fn", "", 0)],
}
HEALTHY = ["ok_gan", "ok_frozen_backbone", "ok_tied_weights", "ok_eval_nograd", "ok_target_net"]
CASES = [*BUGS, *HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "blind3", CASES, lambda case: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_bug_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == BUGS[case]
    assert status == 1


def test_probabilities_fed_to_a_loss_that_wants_scores(runs: dict[str, Run]) -> None:
    _, found = run_findings(runs["double_softmax_ce"])
    [finding] = [f for f in found if f["cause"] == "loss-input"]
    assert "ends with 3 (Softmax), and its output goes to CrossEntropyLoss, which applies " \
           "log_softmax itself" in finding["message"]
    assert "return the raw scores (logits)" in finding["hint"]


def test_a_target_that_broadcasts_names_both_shapes(runs: dict[str, Run]) -> None:
    _, found = run_findings(runs["mse_broadcast"])
    [finding] = [f for f in found if f["cause"] == "loss-broadcast"]
    assert "compares input [16, 1] with target [16]: they broadcast to [16, 16]" \
        in finding["message"]
    assert finding["evidence"] == {"input": [16, 1], "target": [16], "broadcast": [16, 16]}


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0

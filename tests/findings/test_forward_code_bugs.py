"""``check`` on bugs in model and forward code written blind, without reading hooktrace's checks
(``scripts/blind_model.py``, real runs of ``hooktrace run``): each named by the module where the
gradient dies or the first NaN appears, with the words that say its cause; and silence on
healthy look-alikes (a straight-through estimator, a padding mask, a frozen teacher)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Run, Shared, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "blind_model.py"

# case -> its problems (kind, severity, model, module, step), in check's order
BUGS: dict[str, list[tuple[Any, ...]]] = {
    "softmax_singleton_dim": [("zero-gradient", "warning", "model", "pool", 0)],
    "attn_scale_multiplied": [("saturated", "warning", "model", "attn", 0)],
    "layernorm_size1": [("zero-gradient", "warning", "model", "norm", 0)],
    "fakequant_round": [("zero-gradient", "warning", "model", "quant", 0)],
    "vq_no_straight_through": [("no-grad", "warning", "model", "vq", 0)],
    "hard_gate": [("no-grad", "warning", "model", "block", 0)],
    "dropout_keep_prob": [("zero-gradient", "warning", "model", "drop", 0)],
    "custom_fn_no_return": [("no-grad", "warning", "model", "clip", 0)],
    "mha_mask_inverted": [("nonfinite-forward", "error", "model", "attn", 0),
                          ("nonfinite-backward", "error", "model", "", 0)],
    "softmax_overflow": [("nonfinite-forward", "error", "model", "attn", 4),
                         ("nonfinite-backward", "error", "model", "", 4)],
    "pairwise_sqrt_zero": [("nonfinite-backward", "error", "model", "dist", 0),
                           ("nonfinite-forward", "error", "model", "embed.0", 1)],
    "residual_halving": [("vanishing", "warning", "model", "stem", 0)],
    "rnn_hidden_reset": [("no-grad", "warning", "model", "", 0)],
    "plain_tensor_param": [("not-a-parameter", "warning", "model", "", None)],
}
HEALTHY = ["ok_attn_pool", "ok_mha_padding", "ok_ste_round", "ok_data_mask", "ok_pair_dist_eps",
           "ok_rnn_loop", "ok_frozen_teacher"]
CASES = [*BUGS, *HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    """Every case traced and checked once, two at a time (each run is mostly torch's import)."""
    return run_cases(shared, "blind_model", CASES, lambda case: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_boundary_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == BUGS[case]
    assert status == 1


# case -> (kind of the finding, words of its message, words of its hint) that say the cause
CAUSES = {
    # a softmax over the size-1 last dim of (batch, seq, 1) scores: not "multiplied by 0" alone
    "softmax_singleton_dim": (
        "zero-gradient", "the gradient of pool.score's output is exactly zero: its last dim has "
        "size 1, and inside its forward a softmax or normalisation over that dim makes it a "
        "constant", "not its size-1 last dim"),
    # q and k behind a saturated softmax while v, beside them, gets a full gradient
    "attn_scale_multiplied": (
        "saturated", "the gradient reaching attn.q, attn.k's output is at most 3.4e-09 (zero at "
        "some steps) of what a sibling module in its forward gets",
        "multiplied by sqrt(d) instead of divided"),
    # not "its weights are zero" (they are ones), and in every step though not exactly zero
    "layernorm_size1": (
        "zero-gradient", "it normalises over its input's last dim, of size 1: its output is a "
        "constant", "drop the LayerNorm/softmax on a one-value output"),
    "fakequant_round": ("zero-gradient", "it passes back an exactly-zero gradient",
                        "torch.round/floor/sign (a gradient of 0 everywhere: use a "
                        "straight-through estimator"),
    "vq_no_straight_through": ("no-grad", "its input needed a gradient and none came back",
                               "argmax/argmin indices used to index a table"),
    "hard_gate": ("no-grad", "the output of block.gate gets no gradient back",
                  "a comparison such as (x > 0).float()"),
    "dropout_keep_prob": ("zero-gradient", "it dropped its whole input",
                          "its drop probability is 1"),
    "custom_fn_no_return": ("no-grad", "its input needed a gradient and none came back",
                            "a custom autograd.Function whose backward returns None"),
    # a key_padding_mask True on the real tokens: a sequence without padding has every key masked
    "mha_mask_inverted": ("nonfinite-forward", "first NaN/Inf in a forward output: attn "
                          "(MultiheadAttention) at step 0",
                          "a softmax over a row masked entirely with -inf"),
    "softmax_overflow": ("nonfinite-forward", "first NaN/Inf in a forward output: attn "
                         "(NaiveAttention) at step 4", "exp overflowing in a softmax"),
    "residual_halving": ("vanishing", "from head (0.209) back to stem",
                         "residual blocks that scale their sum down"),
    "pairwise_sqrt_zero": ("nonfinite-backward", "first NaN/Inf gradient produced by dist",
                           "sqrt or log near 0"),
    # the state reset in the loop: the first time steps' calls are thrown away, their modules
    # still learn from the last one (they are not starved)
    "rnn_hidden_reset": ("no-grad", "the output of ih, hh, ih (call 1) and 5 more gets no "
                         "gradient back while another call of the same module does",
                         "a recurrent state re-initialised inside the time loop"),
    "plain_tensor_param": ("not-a-parameter", "(root) (TempScaled) holds 1 tensor with "
                           "requires_grad=True that is not an nn.Parameter (log_temp): "
                           "model.parameters() does not hold it",
                           "self.log_temp = nn.Parameter(...)"),
}


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_the_finding_says_why(runs: dict[str, Run], case: str) -> None:
    _, found = run_findings(runs[case])
    kind, said, hint = CAUSES[case]
    [finding] = [f for f in found if f["cause"] == kind]
    assert said in finding["message"]
    assert hint in finding["hint"]


# case -> the modules its boundary starves, at every step
STARVED = {"softmax_singleton_dim": ["pool.score"], "attn_scale_multiplied": ["attn.q", "attn.k"],
           "layernorm_size1": ["body.0", "body.2"], "fakequant_round": ["fc1"],
           "vq_no_straight_through": ["encoder.0", "encoder.2"], "hard_gate": ["block.gate"]}


@pytest.mark.parametrize("case", sorted(STARVED))
def test_the_starved_modules_are_the_evidence(runs: dict[str, Run], case: str) -> None:
    _, found = run_findings(runs[case])
    [finding] = found  # the starved modules are not findings of their own
    assert finding["evidence"]["starved"] == STARVED[case]
    assert finding["evidence"]["steps"] == [0, 1, 2, 3]
    assert Path(finding["source"].rsplit(":", 1)[0]).name == SCRIPT.name


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0

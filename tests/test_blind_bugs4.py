"""``check`` on a fourth set of bugs written blind (``scripts/blind_bugs4.py``, real runs of
``hooktrace run``) for the three families of issue 26: what the optimizer holds versus what the
model is, mixed precision and gradient scaling, and losses and sampling written as functions.
Judged before any fix: 8 of 22 named, 4 misnamed, 10 missed; 15 of 15 healthy look-alikes
silent (notes only). Since, ``lossgraph`` names 6 more (the ops between a functional loss
and the model's output, and the GradScaler's scale in the loss's graph: the three losses given
the wrong inputs, a loss scaled twice, ``optimizer.step()`` on scaled gradients and clipping
before ``unscale_``); 15 of 15 healthy still silent.

By family, before any fix: the optimizer versus the model 6 of 8 named (a head set on a
DataParallel wrapper and weights tied through ``.data`` missed); mixed precision 0 of 7 named
(4 misnamed: the place where the NaN or the overflow shows, or the zero gradient, is named with
a cause that is not the scaler's, the optimizer's or float16's; 3 missed); losses and sampling 2
of 7 named (the two whose gradient never reaches a module: an ``.item()`` term,
``torch.tensor(log_probs)``). Since, by ``lossgraph``: mixed precision 3 more, losses and
sampling 3 more (5 of 7).

Asserted here: the bugs named today and the healthy cases silent today. The misnamed and missed
bugs stay in the script, unasserted, with what ``check`` says of them in ``SCORECARD``. A bug
named since: its consequences (the NaN, the growing gradients) follow it, marked as such."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from conftest import Run, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parent / "scripts" / "blind_bugs4.py"

# every case -> its verdict before any fix, and what check said (the first line of each problem)
SCORECARD: dict[str, str] = {
    # the optimizer versus the model
    "list_blocks": "named: not-optimized (Sequential).0, 'not registered submodules (kept in a "
                   "plain list...)' (the two unnamed blocks are one name; a note calls it x2)",
    "layer_in_forward": "named: not-optimized + params-recreated (Linear), 'creates a new "
                        "nn.Parameter in its forward at every call'",
    "head_on_wrapper": "missed: silent (the new head on the DataParallel wrapper never runs)",
    "tied_by_data": "missed: silent (two Parameters over one storage, both in the optimizer)",
    "weight_norm_after_opt": "named: not-optimized 2.parametrizations.weight, 'build the "
                             "optimizer after adding layers'",
    "two_opts_one_twice": "named: not-optimized model 'decoder', 'the loop steps another "
                          "model's optimizer' (the encoder's double step not said)",
    "step_before_backward": "named: grads-cleared, 'optimizer.step() found every gradient "
                            "already cleared ... order the loop as zero_grad; backward; step'",
    "no_zero_grad": "named: grads-carried-over, 'not cleared after optimizer.step()'",
    # mixed precision and gradient scaling
    "optimizer_step_not_scaler": "misnamed: nonfinite-forward 4 at step 1, 'a float16 overflow' "
                                 "with 'use autocast and GradScaler' (it does; no scaler.step); "
                                 "since: named: scaled-step, 'SGD.step() applied the gradients "
                                 "... still multiplied by the loss scale (65536)', the NaN after",
    "clip_before_unscale": "missed: silent (updates 1/65536 of a clipped one); since: named: "
                           "clip-before-unscale, 'clipped the gradients ... while they were "
                           "still multiplied by the loss scale'",
    "fp16_underflow": "misnamed: zero-gradient 0, 2, 'parameters' gradient is exactly zero' "
                      "with padding_idx / multiplied by 0 hints (float16 underflow not said)",
    "adam_eps_fp16": "misnamed: nonfinite-forward 0 at step 1, 'look inside its forward' (Adam's "
                     "step wrote inf/NaN into the float16 weights)",
    "accum_no_divide": "missed: silent (4 backwards summed without / 4)",
    "scale_twice": "misnamed: exploding at step 2, 'the training diverges ... lower the learning "
                   "rate' (the loss is scaled twice); since: named: scaled-twice, 'multiplied "
                   "by the GradScaler's scale (65536) twice', exploding after it",
    "bf16_weights_stall": "missed: silent (bfloat16 weights, 0.1% of elements ever change)",
    # losses and sampling as functions
    "ce_on_softmax": "missed: silent (F.cross_entropy on F.softmax output); since: named: "
                     "loss-input, 'the output of model 'model' goes through a softmax, then to "
                     "cross_entropy'",
    "aux_loss_item": "named: no-grad (root), 'the output of aux_head gets no gradient back', "
                     ".item() in the hint",
    "vae_sample": "missed: silent (Normal.sample(): the encoder gets the KL gradient only)",
    "lstm_no_batch_first": "missed: silent ((batch, seq, feat) into an LSTM without batch_first)",
    "pg_tensor_logprobs": "named: never-reached model 'policy', torch.tensor(...) in the hint",
    "nll_on_logits": "missed: silent (F.nll_loss on logits, the loss goes negative); since: "
                     "named: loss-input, 'nll_loss ... takes the output of model 'model' as it "
                     "is: the raw scores of 2 (Linear)'",
    "bce_logits_on_sigmoid": "missed: silent (sigmoid output into a with-logits loss); since: "
                             "named: loss-input, 'model 'model' ends with a sigmoid, in (root) "
                             "(ProbClassifier)'",
    # healthy look-alikes
    "ok_scaler_skips": "silent (a note: the skipped steps are the scaler's)",
    "ok_accum_divided": "silent",
    "ok_tied_assign": "silent",
    "ok_checkpoint_reentrant": "silent",
    "ok_checkpoint_nonreentrant": "silent",
    "ok_unscale_clip_step": "silent",
    "ok_bf16_autocast": "silent",
    "ok_vae_rsample": "silent",
    "ok_lstm_batch_first": "silent",
    "ok_lstm_seq_first": "silent",
    "ok_reinforce_stack": "silent (a note: the policy called 8 times per step)",
    "ok_modulelist": "silent",
    "ok_parametrize_before_opt": "silent",
    "ok_gan_two_opts": "silent (a note: the discriminator called twice per step)",
    "ok_ce_on_logits": "silent",
}

# the bugs named today -> their problems (kind, severity, model, module, step), in check's order
BUGS: dict[str, list[tuple[Any, ...]]] = {
    "list_blocks": [("not-optimized", "warning", "model", "(Sequential).0", None)],
    "layer_in_forward": [("not-optimized", "warning", "model", "(Linear)", None),
                         ("params-recreated", "warning", "model", "(Linear)", 1)],
    "weight_norm_after_opt": [("not-optimized", "warning", "model",
                               "2.parametrizations.weight", None)],
    "two_opts_one_twice": [("not-optimized", "warning", "decoder", "", None)],
    "step_before_backward": [("grads-cleared", "warning", "model", "0", 1)],
    "no_zero_grad": [("grads-carried-over", "warning", "model", "0", 1)],
    "aux_loss_item": [("no-grad", "warning", "model", "", 0)],
    "pg_tensor_logprobs": [("never-reached", "error", "policy", "", None)],
    # named since lossgraph
    "optimizer_step_not_scaler": [("scaled-step", "error", "model", "", 0),
                                  ("nonfinite-forward", "error", "model", "4", 1),
                                  ("nonfinite-backward", "error", "model", "", 1)],
    "clip_before_unscale": [("clip-before-unscale", "warning", "model", "", 0)],
    "scale_twice": [("scaled-twice", "error", "model", "", 0),
                    ("exploding", "warning", "model", "0", 2)],
    "ce_on_softmax": [("loss-input", "warning", "model", "", 0)],
    "nll_on_logits": [("loss-input", "warning", "model", "", 0)],
    "bce_logits_on_sigmoid": [("loss-input", "warning", "model", "", 0)],
}
HEALTHY = [case for case in SCORECARD if case.startswith("ok_")]
CASES = [*BUGS, *HEALTHY]


def script_cases() -> list[str]:
    """The names in the script's BUGS and HEALTHY tuples, read without importing torch."""
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    return [elt.id for node in tree.body if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name) and node.target.id in ("BUGS", "HEALTHY")
            and isinstance(node.value, ast.Tuple)
            for elt in node.value.elts if isinstance(elt, ast.Name)]


def test_the_scorecard_has_every_case_of_the_script() -> None:
    assert script_cases() == list(SCORECARD)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_cases(tmp_path_factory.mktemp("blind4"), CASES, lambda case: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_bug_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == BUGS[case]
    assert status == 1


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0

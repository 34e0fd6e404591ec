"""``check`` on bugs written blind, without reading the other bug scripts
(``scripts/blind_bugs.py``, real runs of ``hooktrace run``): the cases it names today, by the module
where the gradient dies or the first NaN appears, with its cause; and silence on healthy
look-alikes (gradient accumulation, frozen BatchNorm statistics, a detached shortcut, an
auxiliary loss with a small weight). The cases it misses stay in the script, untested here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Run, Shared, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "blind_bugs.py"

# case -> its problems (kind, severity, model, module, step), in check's order
BUGS: dict[str, list[tuple[Any, ...]]] = {
    "tensor_rewrap": [("no-grad", "warning", "model", "", 0)],
    "wrong_return": [("no-grad", "warning", "model", "", 0)],
    "optimizer_head_only": [("not-optimized", "warning", "model", "backbone.0", None)],
    "argmax_loss": [("never-reached", "error", "model", "", None)],
    "std_zero": [("nonfinite-forward", "error", "model", "0", 0),
                 ("nonfinite-backward", "error", "model", "", 0)],
    "saturated_gate": [("saturated", "warning", "model", "1.sigmoid", 0)],
    # the NaN gradients an optimizer step wrote into the weights: the next step's forward
    "where_sqrt": [("nonfinite-backward", "error", "model", "1", 0),
                   ("nonfinite-forward", "error", "model", "0", 1)],
    # the backward finding follows from the forward one at the same module and step: after it
    "log_softmax_inf": [("nonfinite-forward", "error", "model", "2", 0),
                        ("nonfinite-backward", "error", "model", "2", 0)],
    # the gradients that grew until the overflow: a warning, not a passing note (the steps
    # after are NaN, not within the threshold)
    "fp16_overflow": [("nonfinite-forward", "error", "model", "0", 3),
                      ("nonfinite-backward", "error", "model", "", 3),
                      ("exploding", "warning", "model", "2", 2)],
}
HEALTHY = ["ok_grad_accum", "ok_frozen_bn_stats", "ok_detach_skip", "ok_aux_small_weight",
           "freeze_too_broad"]  # notes only: a layer frozen beside one that trains is legal
CASES = [*BUGS, *HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    """Every case traced and checked once, two at a time (each run is mostly torch's import)."""
    return run_cases(shared, "blind", CASES, lambda case: SCRIPT)


def findings(runs: dict[str, Run], case: str) -> tuple[int, list[dict[str, Any]]]:
    return run_findings(runs[case])


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_boundary_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = findings(runs, case)
    assert problems(found) == BUGS[case]
    assert status == 1


# case -> (kind of the finding, words of its message, words of its hint) that say the cause
CAUSES = {
    "tensor_rewrap": ("no-grad", "the output of encoder gets no gradient back",
                      "a tensor rebuilt with torch.tensor(...) or torch.from_numpy"),
    "wrong_return": ("no-grad", "the output of block2 gets no gradient back",
                     "an output the loss does not use"),
    "optimizer_head_only": ("not-optimized",
                            "no optimizer that steps holds the parameters of backbone.0, "
                            "backbone.2 (2 modules of model 'model')",
                            "the optimizer holds only fc's parameters: pass model.parameters()"),
    "argmax_loss": ("never-reached", "no backward pass ever reached it",
                    "argmax, round or comparisons, which have no gradient "
                    "(loss.requires_grad = True only hides the error)"),
    "std_zero": ("nonfinite-forward", "first NaN/Inf in a forward output: 0 (Standardize)",
                 "division by 0"),
    "log_softmax_inf": ("nonfinite-forward", "first NaN/Inf in a forward output: 2 (ProbHead)",
                        "log or sqrt of <= 0"),
    "fp16_overflow": ("nonfinite-forward",
                      "at step 3 (again in steps 4, 5): a float16 overflow (Inf past 65504, no "
                      "NaN, from finite inputs), after the largest parameter-gradient norm grew",
                      "torch.amp.GradScaler"),
    "where_sqrt": ("nonfinite-backward", "first NaN/Inf gradient produced by 1 (SafeSqrt)",
                   "torch.where does not stop the gradient of the branch it does not pick"),
    "saturated_gate": ("saturated", "it is saturated: it passes back 4.8e-18 of the gradient",
                       "a bias initialised far from 0"),
}


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_the_finding_says_why(runs: dict[str, Run], case: str) -> None:
    _, found = findings(runs, case)
    kind, said, hint = CAUSES[case]
    [finding] = [f for f in found if f["cause"] == kind]
    assert said in finding["message"]
    assert hint in finding["hint"]


# case -> the kind of its finding, the modules a cut-off gradient starves (a gate's value too:
# the saturated sigmoid's output multiplies it)
STARVED = {"tensor_rewrap": ("no-grad", ["encoder.0", "encoder.2"]),
           "wrong_return": ("no-grad", ["block2.0", "block2.2"]),
           "saturated_gate": ("saturated", ["1.gate", "1.value"])}


@pytest.mark.parametrize("case", sorted(STARVED))
def test_the_starved_modules_are_the_evidence(runs: dict[str, Run], case: str) -> None:
    _, found = findings(runs, case)
    kind, starved = STARVED[case]
    [finding] = found  # the starved modules are not findings of their own (a vanishing note)
    assert (finding["cause"], finding["evidence"]["starved"]) == (kind, starved)
    assert finding["evidence"]["steps"] == [0, 1, 2, 3]
    assert Path(finding["source"].rsplit(":", 1)[0]).name == SCRIPT.name


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = findings(runs, case)
    assert problems(found) == []
    assert status == 0


def test_no_backward_means_no_step_to_count_calls_in(runs: dict[str, Run]) -> None:
    """A loss from argmax never runs backward: the iterations are not told apart, so modules
    called once an iteration are not "called several times per step"."""
    _, found = findings(runs, "argmax_loss")
    assert [f["cause"] for f in found] == ["never-reached"]


def test_a_too_broad_freeze_is_a_note_on_each_frozen_layer(runs: dict[str, Run]) -> None:
    """A name match meant for encoder.layers.0 froze decoder.layers.0 too: not an error (a
    frozen layer beside trainable ones is legal), but each is said, the unintended one included:
    in the model's one frozen note (issue 38), the intended one as a frozen backbone, the other
    among trainable modules."""
    _, found = findings(runs, "freeze_too_broad")
    assert [(f["cause"], f["module"]) for f in found] == [("frozen", "encoder.layers.0")]
    roles = found[0]["evidence"]["roles"]
    assert (roles["backbone"], roles["other"]) == (["encoder.layers.0"], ["decoder.layers.0"])
    assert "frozen among trainable modules (decoder.layers.0)" in found[0]["message"]

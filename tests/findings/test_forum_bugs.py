"""``check`` on more forum bugs (``scripts/forum_bugs.py``, real runs of ``hooktrace run``): each
named by the module where it happens, with its cause; a run that crashed is never "no problems";
and silence on healthy look-alikes (a GAN rerunning its generator, adversarial training with
torch.autograd.grad, LBFGS, a teacher under no_grad)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import hooktrace_cmd, problems

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "forum_bugs.py"


def check_case(tmp_path: Path, case: str, exit_code: int = 0) -> tuple[int, list[dict[str, Any]]]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", "-o", log, SCRIPT, case)
    assert run.returncode == exit_code, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


# case -> (the script's own exit code, the one problem: kind, severity, model, module, step)
BUGS = {
    "item_param": (0, ("no-grad", "warning", "model", "temp", 0)),
    "plain_list": (0, ("not-optimized", "warning", "model", "(hidden[0])", None)),
    "model_recreated": (0, ("not-optimized", "warning", "model", "", None)),
    "no_grad_backbone": (0, ("no-grad-under-no_grad", "warning", "backbone", "", None)),
    "cleared_before_step": (0, ("grads-cleared", "warning", "model", "0", 0)),
    "frozen_all": (1, ("script-error", "error", "model", "", 0)),
    "inplace_param": (1, ("forward-error", "error", "model", "1", 0)),
    "hidden_carried": (1, ("backward-error", "error", "model", "rnn", 1)),
    "all_padding": (0, ("zero-gradient", "warning", "model", "embed", 0)),
    "diverges": (0, ("exploding", "warning", "model", "0", 3)),
}


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_cause_is_named(tmp_path: Path, case: str) -> None:
    exit_code, problem = BUGS[case]
    status, found = check_case(tmp_path, case, exit_code)
    assert problems(found) == [problem]
    assert status == 1


# case -> words of the finding's message and of its hint that say the cause
CAUSES = {
    "item_param": ("its backward ran but its own parameters never got a gradient", ".item()"),
    "plain_list": ("no optimizer that steps holds the parameters of (hidden[0]), (hidden[1])",
                   "nn.ModuleList"),
    "model_recreated": ("no optimizer that steps holds any parameter of model 'model'",
                        "another copy of the model"),
    "no_grad_backbone": ("ran only under torch.no_grad() while an optimizer steps",
                         "outside torch.no_grad()"),
    "cleared_before_step": ("zero_grad() ran between backward() and step()",
                            "optimizer.zero_grad(); loss.backward(); optimizer.step()"),
    "frozen_all": ("every parameter of model 'model' is frozen", "every parameter frozen"),
    "inplace_param": ("1 (PrunedLinear) raised RuntimeError in its forward",
                      "w = self.weight * mask"),
    "hidden_carried": ("while the backward of rnn (LSTM) ran", "h = h.detach()"),
    "all_padding": ("parameters' gradient is exactly zero (embed, steps 0, 1, 2, 3)",
                    "padding_idx"),
    "diverges": ("over the steps, the largest parameter-gradient norm grew from",
                 "Lower the learning rate"),
}


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_the_finding_says_why(tmp_path: Path, case: str) -> None:
    _, found = check_case(tmp_path, case, BUGS[case][0])
    [finding] = [f for f in found if f["severity"] != "note"]
    said, hint = CAUSES[case]
    assert said in finding["message"]
    assert hint in finding["hint"]


# case -> the line of the script the error came through
ERROR_LINES = {"inplace_param": "self.weight.mul_(self.mask)",
               "hidden_carried": "F.cross_entropy(logits.reshape(-1, 20), target.reshape(-1))"}


@pytest.mark.parametrize("case", sorted(ERROR_LINES))
def test_an_error_names_the_line_it_came_through(tmp_path: Path, case: str) -> None:
    _, found = check_case(tmp_path, case, 1)
    [finding] = [f for f in found if f["severity"] != "note"]
    file, line = finding["evidence"]["line"].rsplit(":", 1)
    assert Path(file).name == SCRIPT.name
    assert SCRIPT.read_text().splitlines()[int(line) - 1].strip().startswith(ERROR_LINES[case])


def test_nan_gradients_applied_by_the_optimizer(tmp_path: Path) -> None:
    """A sqrt without eps makes NaN gradients at step 0; the optimizer applies them, and the
    first NaN forward output (step 1) is explained by them, not by its own forward."""
    _, found = check_case(tmp_path, "nan_gradient_applied")
    assert problems(found) == [("nonfinite-backward", "error", "model", "dist", 0),
                               ("nonfinite-forward", "error", "model", "embed.0", 1)]
    forward = found[1]
    assert forward["message"].endswith("after the NaN/Inf gradients of step 0")
    assert "applied the NaN/Inf gradients of step 0" in forward["hint"]


@pytest.mark.parametrize("case", ["ok_gan_rerun", "ok_adversarial", "ok_gradient_penalty",
                                  "ok_tiny_auxiliary_head", "ok_loss_modules", "ok_lbfgs",
                                  "ok_teacher"])
def test_healthy_look_alikes_are_silent(tmp_path: Path, case: str) -> None:
    status, found = check_case(tmp_path, case)
    assert problems(found) == []
    assert status == 0

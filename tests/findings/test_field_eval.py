"""``check`` on field programs of issue 38 (``scripts/field_eval.py``, real runs of ``hooktrace
run``): evaluation passes between optimizer steps, and notes that flood or mislead.

* a wrapped timm resnet18 validated under ``inference_mode`` when an epoch ends within the
  recorded steps (timm's ``train.py``): silent; before, one ``no-grad-under-no_grad`` warning
  starving the 41 trainable modules of the model, though each got its gradient in the training
  pass of the same step;
* its look-alike that is a bug, the training forward run under ``no_grad`` by mistake but for
  the classifier: still found, as one warning listing the subtrees (before, one per module: 40);
* LoRA on 32 layers (plain torch, as peft builds it): silent, and its report reads in a screen:
  the frozen modules one note for the model, by role (the layers adapted, a frozen backbone);
  before, one note per frozen module (323 notes, 1038 lines);
* a BYOL target (a ``deepcopy`` of the online network, frozen, updated by an EMA, run in train
  mode): silent, the target named as a frozen copy of the online encoder, and no ``.eval()``
  advice for its BatchNorms (before, a ``frozen-bn-training`` note per BatchNorm);
* the timm validation with gradients on, in eval mode only: silent, the EMA copy one note
  (before, two ``no-grad`` warnings, the wrapped model's 41 modules and the copy's);
* a model trained in eval mode on purpose (a frozen BatchNorm) is training, not evaluation:
  silent, and with its recurrent state reset inside the loop, still found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Shared, hooktrace_cmd, problems, run_cases, run_findings, script_cases

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "field_eval.py"
HEALTHY = ["timm_validate", "timm_task_ema", "lora_32", "byol_target", "timm_validate_grad",
           "eval_finetune"]

# the backbone of timm's resnet18: every module with parameters but fc
BACKBONE = ["conv1", "bn1"] + [
    f"layer{i}.{j}.{part}" for i in range(1, 5) for j in range(2)
    for part in ("conv1", "bn1", "conv2", "bn2")
    + (("downsample.0", "downsample.1") if i > 1 and j == 0 else ())]


@pytest.fixture
def cases(shared: Shared) -> Cases:
    return run_cases(shared, "field_eval", script_cases(SCRIPT), lambda case: SCRIPT)


def found(cases: Cases, case: str) -> list[dict[str, Any]]:
    _, findings = run_findings(cases[case])
    return findings


def test_the_script_holds_the_cases_tested() -> None:
    assert script_cases(SCRIPT) == [*HEALTHY, "bug_train_no_grad", "bug_eval_reset"]


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_field_programs_are_silent(cases: Cases, case: str) -> None:
    assert problems(found(cases, case)) == []


def test_a_validation_pass_between_steps_is_not_training(cases: Cases) -> None:
    """timm validates ``wrapper.model`` under inference_mode after steps 2 and 5: those calls
    fall in steps 3 and 6 beside the training pass, and are not judged as training."""
    traced, _ = cases["timm_validate"]
    assert traced.stdout.count("top-1") == 2  # two epochs ended within the recorded steps
    kinds = {f["cause"] for f in found(cases, "timm_validate")}
    assert not kinds & {"no-grad", "no-grad-under-no_grad"}


def test_a_validation_pass_with_gradients_on_is_not_training(cases: Cases) -> None:
    """The validation of steps 2 and 5 with gradients on, after .eval() only: the log marks its
    calls ``eval`` (and only those: training runs in train mode), and they are not judged as
    training; the EMA copy, validated so, no optimizer holds: an evaluation copy."""
    traced, _ = cases["timm_validate_grad"]
    assert traced.stdout.count("top-1") == 2
    events = [json.loads(line) for line in (cases.folder / "timm_validate_grad.jsonl").open()]
    evaluated = {e["step"] for e in events if e["type"] == "forward" and e.get("eval")}
    assert evaluated == {3, 6}  # the validations after steps 2 and 5 fall in the next step
    findings = found(cases, "timm_validate_grad")
    assert not {f["cause"] for f in findings} & {"no-grad", "called-several-times"}
    [note] = [f for f in findings if f["cause"] == "evaluation-copy"]
    assert (note["model"], note["module"]) == ("model", "")
    assert "ran only in eval mode, with no backward, and no optimizer" in note["message"]


def test_training_in_eval_mode_is_not_evaluation(cases: Cases) -> None:
    """Fine-tuned in eval mode on purpose: every call is marked ``eval`` and gets its backward;
    no evaluation copy. Its look-alike with the state reset inside the loop keeps its finding:
    the cell's calls thrown away are in eval mode with no backward, inside a forward that
    trained."""
    assert "evaluation-copy" not in {f["cause"] for f in found(cases, "eval_finetune")}
    events = [json.loads(line) for line in (cases.folder / "eval_finetune.jsonl").open()]
    assert all(e.get("eval") for e in events if e["type"] == "forward")
    findings = found(cases, "bug_eval_reset")
    assert problems(findings) == [("no-grad", "warning", "model", "", 0)]
    [f] = [f for f in findings if f["severity"] != "note"]
    assert f["evidence"]["starved"] == ["ih", "hh"]
    assert "gets no gradient back while another call of the same module does" in f["message"]


def test_an_ema_copy_inside_the_task_is_one_note(cases: Cases) -> None:
    """timm's task holds the EMA copy beside the model it trains: the copy keeps
    requires_grad=True, runs only under inference_mode, and no optimizer holds it. An
    evaluation copy, said once, not a gradient the model lost."""
    traced, _ = cases["timm_task_ema"]
    assert traced.stdout.count("ema top-1") == 2
    findings = found(cases, "timm_task_ema")
    [note] = [f for f in findings if f["cause"] == "evaluation-copy"]
    assert (note["severity"], note["module"]) == ("note", "trainable_module_ema")
    assert len(note["evidence"]["modules"]) == 41  # resnet18's modules with parameters
    assert all(name.startswith("trainable_module_ema.module.")
               for name in note["evidence"]["modules"])


def test_training_forward_under_no_grad_is_one_finding(cases: Cases) -> None:
    """The look-alike that is a bug: its backbone runs only under no_grad while fc trains."""
    findings = found(cases, "bug_train_no_grad")
    assert problems(findings) == [("no-grad-under-no_grad", "warning", "net", "conv1", 0)]
    [f] = [f for f in findings if f["severity"] != "note"]
    assert sorted(f["evidence"]["modules"]) == sorted(BACKBONE)
    assert f["evidence"]["steps"] == list(range(8))
    assert f["message"].startswith("conv1, bn1, layer1, layer2, layer3, layer4 (40 modules ")


def test_lora_frozen_layers_one_note_by_role(cases: Cases) -> None:
    findings = found(cases, "lora_32")
    [frozen] = [f for f in findings if f["cause"] == "frozen"]
    roles = frozen["evidence"]["roles"]
    assert roles["copy"] == {} and roles["other"] == []
    assert sorted(roles["adapted"]) == sorted(
        f"layers.{i}.{proj}.base_layer" for i in range(32) for proj in ("q_proj", "v_proj"))
    assert roles["backbone"][:3] == ["embed", "layers.0.norm1", "layers.0.k_proj"]
    assert len(roles["backbone"]) == 2 + 32 * 6 + 1  # embed, 6 per layer, norm, lm_head
    assert len(frozen["evidence"]["modules"]) == 32 * 8 + 3
    assert "64 layers adapted (layers.*.q_proj.base_layer (x32), " in frozen["message"]
    assert "a frozen backbone (embed, layers.*.norm1 (x32), " in frozen["message"]


def test_lora_report_reads_in_a_screen(cases: Cases) -> None:
    """The text report of the 32-layer model reads in a screen: 13 lines, the frozen layers one
    note, the zero-initialised ``lora_B`` layers one (before: 1038 lines, 323 notes)."""
    result = hooktrace_cmd("check", cases.folder / "lora_32.jsonl")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 13, result.stdout
    assert "Notes (2)" in lines
    assert lines[-1].startswith("No problems found (")
    assert sum(line.startswith("  [frozen]") for line in lines) == 1


def test_byol_target_is_a_frozen_copy_without_eval_advice(cases: Cases) -> None:
    findings = found(cases, "byol_target")
    assert [f["cause"] for f in findings if f["cause"] == "frozen-bn-training"] == []
    [frozen] = [f for f in findings if f["cause"] == "frozen"]
    assert frozen["module"] == "target_encoder"
    assert frozen["evidence"]["roles"] == {
        "copy": {"target_encoder": "online_encoder"}, "adapted": [], "backbone": [], "other": []}
    assert "a frozen copy of online_encoder (Sequential)" in frozen["message"]
    assert ".eval()" not in frozen["hint"]

"""Blind set 5's samples and positions that see what they must not (``scripts/blind_bugs5.py``),
traced with ``hooktrace run --probe`` (issue 36, item 4): a second scorecard beside the default
run's (``test_training_step_invariant_bugs.py``, where the probe is off and these stay missed).

Probed: 7 of 7 named (a reshape that mixes samples, BatchNorm under InfoNCE, a mean pool over
padding, a flipped and an off-by-one causal mask, an inverted key_padding_mask, an encoder
without a causal mask in next-step prediction), each by the culprit the default run's
``CULPRIT`` expects; every healthy look-alike of blind set 5, probed too, stays silent (the
probe's facts are notes), and so do real healthy models probed (resnet18's BatchNorm in a
classifier is a note; Hugging Face models called with ``input_ids=``; SimSiam and BYOL, whose
BatchNorm sits under a cosine loss, not a similarity matrix).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from groundtruth import Case
from healthy_models import classification, hf_model
from healthy_patterns import PATTERNS
from helpers import Cases, Run, Shared, problems, run_cases, run_findings

import hooktrace
from hooktrace.check.checklog import run_checks

from .test_training_step_invariant_bugs import CULPRIT, HEALTHY, names_culprit

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "blind_bugs5.py"

# the family's bugs -> their problems with --probe (kind, severity, model, module, step)
PROBED: dict[str, list[tuple[Any, ...]]] = {
    "view_mixes_samples": [("samples-mixed", "warning", "model", "", 0)],
    "batchnorm_contrastive": [("samples-mixed", "warning", "model", "net.1", 0)],
    "mean_pool_over_padding": [("sees-padding", "warning", "model", "", 0)],
    "causal_mask_flipped": [("sees-later", "warning", "model", "attn", 0)],
    "causal_mask_off_by_one": [("sees-later", "warning", "model", "attn", 0)],
    "key_padding_mask_inverted": [("sees-padding", "warning", "model", "attn", 0),
                                  ("vanishing", "warning", "model", "embed", 2)],
    "encoder_without_causal_mask": [("sees-later", "warning", "model", "encoder", 0)],
}
# the family's look-alikes -> the probe's notes each gets (kind, module)
NOTES: dict[str, list[tuple[str, str]]] = {
    "ok_permute_then_reshape": [("probe", "")],
    "ok_groupnorm_contrastive": [("probe", "")],
    "ok_masked_mean_pool": [("probe", ""), ("probe", "")],
    "ok_causal_mask": [("probe", ""), ("probe", "attn")],
    "ok_key_padding_mask": [("probe", ""), ("probe", "")],
    "ok_encoder_causal": [("probe", ""), ("probe", "encoder")],
}
CASES = [*PROBED, *HEALTHY]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "blind5-probe", CASES, lambda case: SCRIPT, ("--probe",))


@pytest.mark.parametrize("case", sorted(PROBED))
def test_the_probe_names_the_bug(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == PROBED[case]
    assert any(names_culprit(f, CULPRIT[case]) for f in found)
    assert status == 1


@pytest.mark.parametrize("case", sorted(NOTES))
def test_the_probe_states_what_holds(runs: dict[str, Run], case: str) -> None:
    _, found = run_findings(runs[case])
    said = [(f["cause"], f["module"]) for f in found if f["cause"] in ("probe", "samples-mixed")]
    assert sorted(said) == sorted(NOTES[case])
    assert all(f["severity"] == "note" for f in found if f["cause"] == "probe")


@pytest.mark.parametrize("case", HEALTHY)
def test_probed_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    """Every look-alike of blind set 5 but its two false alarms of the default run (item 5's),
    which the probe must not add to."""
    status, found = run_findings(runs[case])
    assert not [p for p in problems(found) if p[0] in ("samples-mixed", "sees-later",
                                                       "sees-padding", "probe")]
    if case not in ("ok_gan_toggle_requires_grad", "ok_module_twice_monitored"):
        assert problems(found) == []
        assert status == 0


# healthy models, probed -> the kinds of the probe's notes on them
HEALTHY_MODELS: dict[str, tuple[Callable[[], Case], list[str]]] = {
    "resnet18": (lambda: classification("resnet18"), ["samples-mixed"]),
    "mobilenet_v3_small": (lambda: classification("mobilenet_v3_small"), ["samples-mixed"]),
    "hf_bert": (lambda: hf_model("bert"), ["probe"]),
    "hf_gpt2": (lambda: hf_model("gpt2"), ["probe"]),
    "simsiam": (PATTERNS["simsiam"], ["samples-mixed", "samples-mixed"]),
    "byol": (PATTERNS["byol"], ["samples-mixed", "samples-mixed"]),
    "linear_probe": (PATTERNS["linear_probe"], ["probe"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HEALTHY_MODELS))
def test_probed_healthy_models_are_silent(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    make, notes = HEALTHY_MODELS[name]
    case = make()
    log = tmp_path / "log.jsonl"
    with hooktrace.trace(log, model=case.models if case.scoped else None, probe=True,
                         steps="0:2"):
        for _ in range(2):
            case.backward()
            case.update()
    report = run_checks(log)
    assert [f"{f.cause} {f.module}: {f.message}" for f in report.problems] == []
    said = [f for f in report.findings if f.cause in ("probe", "samples-mixed")]
    assert sorted(f.cause for f in said) == sorted(notes)
    assert all(f.severity == "note" for f in said)

"""How the models of a run relate over the steps (issue 36, item 5), stated as facts in
``check``'s Models block and in ``--json``'s ``models``: real runs of
``scripts/model_relations.py``: a GAN (two optimizers, the discriminator frozen in turns; also
with its models gone before tracing stops), a mean teacher (a moving average of its student, no
optimizer), a DQN's target network (copied every third step), a frozen feature extractor with
a trained head. Facts are no findings: each run stays "No problems found"; a single model's
report has no Models block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import Cases, Shared, hooktrace_cmd, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "model_relations.py"
GAN = [
    "  G (Sequential): trained by Adam after the backward passes of steps 1, 3, 5, 7; "
    "loss BinaryCrossEntropyWithLogits on D's output",
    "  D (Sequential): trained by Adam after the backward passes of steps 0, 2, 4, 6; "
    "loss BinaryCrossEntropyWithLogits; frozen in turns: in the backward passes of steps "
    "1, 3, 5, 7",
]
MODELS = {
    "gan": GAN,
    "gan_in_main": GAN,
    "mean_teacher": [
        "  teacher (Sequential): a moving average of student (started as its copy, changed at "
        "every step, stepped by no optimizer); frozen throughout; evaluated only, under "
        "torch.no_grad",
        "  student (Sequential): trained by SGD after every backward pass; "
        "losses MseLoss and NllLoss",
    ],
    "dqn": [
        "  target_net (Sequential): a copy of q_net (the same weights at steps 0, 3); stepped "
        "by no optimizer; evaluated only, under torch.no_grad",
        "  q_net (Sequential): trained by Adam after every backward pass; loss SmoothL1Loss",
    ],
    "frozen_backbone": [
        "  features (Sequential): frozen throughout; evaluated only (no backward pass reached "
        "it)",
        "  head (Linear): trained by SGD after every backward pass; loss NllLoss",
    ],
    "single": [],
}


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "model_relations", list(MODELS), lambda case: SCRIPT)


def block(text: str) -> list[str]:
    """The Models block's lines, its heading left out; [] where it has none."""
    lines = text.splitlines()
    if "Models (" not in "\n".join(lines):
        return []
    start = next(i for i, line in enumerate(lines) if line.startswith("Models ("))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    assert lines[start] == f"Models ({end - start - 1})"
    return lines[start + 1:end]


@pytest.mark.parametrize("case", list(MODELS))
def test_the_models_block_states_how_the_models_relate(runs: Cases, case: str) -> None:
    checked = hooktrace_cmd("check", runs.folder / f"{case}.jsonl")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert block(checked.stdout) == MODELS[case]
    if MODELS[case]:  # before the findings, after the first line
        assert lines[1:3] == ["", f"Models ({len(MODELS[case])})"]
    assert lines[-1].startswith("No problems found (")


@pytest.mark.parametrize("case", list(MODELS))
def test_json_lists_the_models_and_they_are_no_problems(runs: Cases, case: str) -> None:
    status, found = run_findings(runs[case])
    assert (status, problems(found)) == (0, [])
    models = json.loads(runs[case][1].stdout)["models"]
    assert [f"  {m['text']}" for m in models] == MODELS[case]


def test_the_gans_facts_as_data(runs: Cases) -> None:
    g, d = json.loads(runs["gan"][1].stdout)["models"]
    assert g["optimizers"] == [{"optimizer": "Adam", "steps": 4, "after": [1, 3, 5, 7]}]
    assert g["losses"] == [{"loss": "BinaryCrossEntropyWithLogits", "on": "D"}]
    assert (g["frozen"], d["frozen"], d["frozen_steps"]) == (None, "in turns", [1, 3, 5, 7])
    assert (g["backward"], d["backward"], g["copy_of"]) == (True, True, None)
    teacher = json.loads(runs["mean_teacher"][1].stdout)["models"][0]
    assert (teacher["copy_of"], teacher["average"], teacher["copied_at"]) == ("student", True,
                                                                              [0])
    target = json.loads(runs["dqn"][1].stdout)["models"][0]
    assert (target["copy_of"], target["average"], target["copied_at"]) == ("q_net", False,
                                                                           [0, 3])
    assert (target["backward"], target["no_grad_only"]) == (False, True)

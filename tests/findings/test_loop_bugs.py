"""``check`` on training-loop bugs that module hooks can see (``scripts/loop_bugs.py``, real
runs of ``hooktrace run``): each named with its kind, model and module; and silence on the
healthy look-alikes (gradient accumulation, a validation pass followed by model.train())."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES, Traced, hooktrace_cmd, read_log

from hooktrace.log import schema

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "loop_bugs.py"


def check_case(tmp_path: Path, case: str) -> tuple[int, list[dict[str, Any]], Path]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", "-o", log, SCRIPT, case)
    assert run.returncode == 0, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"], log


# case -> (kind, severity, module, step)
BUGS = {
    "eval_backward": ("eval-backward", "warning", "", 2),
    "not_optimized": ("not-optimized", "warning", "head", None),
    "no_zero_grad": ("grads-carried-over", "warning", "stem", 1),
    "backward_hook": ("backward-hook", "warning", "block", None),
    "loss_detached": ("never-reached", "error", "", None),
}


@pytest.mark.parametrize("case", sorted(BUGS))
def test_loop_bug_is_named(tmp_path: Path, case: str) -> None:
    status, found, _ = check_case(tmp_path, case)
    kind, severity, module, step = BUGS[case]
    problems = [f for f in found if f["severity"] != "note"]
    assert [(f["cause"], f["severity"], f["model"], f["module"], f["step"]) for f in problems] \
        == [(kind, severity, "model", module, step)]
    assert status == 1


def test_not_optimized_names_only_the_new_layer(tmp_path: Path) -> None:
    _, found, _ = check_case(tmp_path, "not_optimized")
    [finding] = [f for f in found if f["cause"] == "not-optimized"]
    assert finding["evidence"]["modules"] == ["head"]


def test_carried_over_names_every_module_and_where_to_look(tmp_path: Path) -> None:
    _, found, _ = check_case(tmp_path, "no_zero_grad")
    [finding] = [f for f in found if f["cause"] == "grads-carried-over"]
    assert finding["evidence"]["modules"] == ["stem", "block.fc", "block.norm", "head"]
    assert "zero_grad" in finding["hint"]


def test_backward_hook_names_the_function(tmp_path: Path) -> None:
    _, found, _ = check_case(tmp_path, "backward_hook")
    [finding] = [f for f in found if f["cause"] == "backward-hook"]
    assert finding["evidence"]["hook"] == "main.<locals>.<lambda>"
    assert "register_full_backward_hook" in finding["hint"]
    assert "loop_bugs.py:" in finding["source"]


def test_frozen_batchnorm_in_train_mode_is_a_note(tmp_path: Path) -> None:
    _, found, _ = check_case(tmp_path, "frozen_bn")
    [note] = [f for f in found if f["cause"] == "frozen-bn-training"]
    assert (note["severity"], note["module"]) == ("note", "block.norm")


@pytest.mark.parametrize("case", ["ok_accumulation", "ok_validation"])
def test_healthy_loops_are_silent(tmp_path: Path, case: str) -> None:
    """Gradient accumulation done right (zero_grad once per optimizer step), and a validation
    pass in eval mode followed by model.train(): no problem."""
    status, found, log = check_case(tmp_path, case)
    assert [f for f in found if f["severity"] != "note"] == []
    assert status == 0
    signals = [r for r in read_log(log) if isinstance(r, schema.Signal)]
    # the optimizer was seen, and facts: the loss's ops (written once), the share of
    # exactly-zero elements in a container's output gradients (a ReLU's), the optimizer's
    # steps (issue 38: judged in the units training uses), the loss ledger's values, and the
    # parameters that never moved: the biases before a BatchNorm, whose gradient it makes
    # exactly zero (a fact, no finding), the sampled weights' moves against their optimizer's
    # (a fact: each step explained), the ledger's learning rates; nothing else to say
    assert {s.kind for s in signals} - {"grad-zeros"} == {
        "optimizers", "loss-ops", "optimizer-steps", "loss-values", "params-unmoved",
        "step-sample", "optimizer-lrs"}
    [steps] = [s for s in signals if s.kind == "optimizer-steps"]
    # accumulation: a step after every second backward pass
    after = [1, 3] if case == "ok_accumulation" else [0, 1, 2, 3]
    assert (steps.detail["after"], steps.detail["count"], steps.detail["moving"]) == (
        after, len(after), after[0])


def test_sources_point_at_the_user_forward(tmp_path: Path) -> None:
    """Each class of the user's is recorded once with the file and line of its forward; torch's
    own classes are not."""
    _, _, log = check_case(tmp_path, "ok_validation")
    sources = {r.cls: (Path(r.file).name, r.line) for r in read_log(log)
               if isinstance(r, schema.Source)}
    text = SCRIPT.read_text().splitlines()
    assert set(sources) == {"Net", "Block"}
    for file, line in sources.values():
        assert file == "loop_bugs.py"
        assert text[line - 1].strip().startswith("def forward(")


def test_forgot_train_mode_sample(traced: Traced) -> None:
    log = traced(SAMPLES / "forgot_train_mode.py")
    result = hooktrace_cmd("check", "--json", log)
    found = json.loads(result.stdout)["findings"]
    assert [(f["cause"], f["model"], f["step"]) for f in found if f["severity"] != "note"] == [
        ("eval-backward", "model", 3)]
    assert result.returncode == 1


def test_gan_is_silent(traced: Traced) -> None:
    """A GAN done right: the discriminator's step detaches the generator's output, and the
    generator's backward adds to the discriminator's gradients, which its next zero_grad clears:
    neither a detached branch nor gradients carried over."""
    log = traced(SAMPLES / "gan.py")
    result = hooktrace_cmd("check", "--json", log)
    found = json.loads(result.stdout)["findings"]
    assert [f for f in found if f["severity"] != "note"] == []
    assert result.returncode == 0


def test_stale_optimizer_sample(traced: Traced) -> None:
    """The optimizer holds the parameters of a model built before the one the loop trains:
    one warning naming the model, with every module that gets gradients and never trains."""
    log = traced(SAMPLES / "stale_optimizer.py")
    result = hooktrace_cmd("check", "--json", log)
    found = json.loads(result.stdout)["findings"]
    assert [(f["cause"], f["severity"], f["model"], f["module"]) for f in found] == [
        ("not-optimized", "warning", "model", "")]
    assert found[0]["evidence"]["modules"] == ["features.0", "features.2", "head"]
    assert result.returncode == 1

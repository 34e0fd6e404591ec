"""Target networks in the field (issue 38 item 6), on real runs of ``hooktrace run``
(``tests/scripts/field_targets.py``): a BYOL target made without ``copy.deepcopy`` is the
online network itself, and ``check`` names it (``shared-target``); a correct BYOL target, a
frozen teacher, tied weights, a siamese encoder and a frozen feature network held under two
names stay silent; a freeze inside the first forward keeps its ``frozen`` note. Every gradient
claim ``check`` makes on them agrees with PyTorch's census of ``.grad`` over the whole run, per
backward pass and per optimizer step (``truthclaims``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from groundtruth import NONE, NONZERO, GradTruth
from helpers import Shared, hooktrace_cmd, script_cases
from truthclaims import claims, disagreements

from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import Finding, Report

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "field_targets.py"
CASES = script_cases(SCRIPT)
BUGS = ["byol_lazy_shared", "byol_eager_shared"]
ONLINE = ["online_encoder.net.0", "online_encoder.net.1", "online_encoder.net.5",
          "online_encoder.projector.0", "online_encoder.projector.1",
          "online_encoder.projector.3"]


class Run:
    """A case traced once per test run, its census and what ``check`` says of its log."""

    def __init__(self, made: dict[str, Any]) -> None:
        self.log = Path(made["log"])
        self.truth = GradTruth.load(made["truth"])
        self.stdout: str = made["stdout"]
        self.report: Report = run_checks(self.log)

    @property
    def problems(self) -> list[Finding]:
        return self.report.problems


def field_run(shared: Shared, case: str) -> Run:
    def make(folder: Path) -> dict[str, Any]:
        log, truth = folder / f"{case}.jsonl", folder / f"{case}.truth.json"
        run = hooktrace_cmd("run", "-o", log, SCRIPT, case, truth)
        assert run.returncode == 0, run.stderr
        return {"log": str(log), "truth": str(truth), "stdout": run.stdout}

    return Run(shared(f"field_targets/{case}", make))


def moved(run: Run) -> float:
    """How far the backbone's weights moved over the run, as the script printed it."""
    line = next(x for x in run.stdout.splitlines() if x.startswith("backbone moved "))
    return float(line.split()[-1])


@pytest.mark.parametrize("case", BUGS)
def test_a_target_that_is_the_online_network_is_named(shared: Shared, case: str) -> None:
    run = field_run(shared, case)
    [found] = run.problems
    assert (found.cause, found.severity, found.model, found.module, found.step) == (
        "shared-target", "warning", "learner", "online_encoder", 0)
    assert found.message == (
        "online_encoder (NetWrapper) is also registered as target_encoder: one module, not a "
        "copy, so the target network runs the online network's own parameters. "
        + ", ".join(ONLINE) + " (6 modules of model 'learner') ran with gradients and under "
        "torch.no_grad() in the same step, and their parameters are frozen "
        "(requires_grad=False): freezing the target froze the online network, which never "
        "trains")
    assert found.evidence["modules"] == ONLINE
    assert found.evidence["aliases"] == {"online_encoder": "target_encoder"}
    assert found.evidence["steps"] == [0, 1, 2, 3, 4, 5]
    assert "target_encoder = copy.deepcopy(online_encoder)" in found.hint


@pytest.mark.parametrize("case", BUGS)
def test_the_online_network_never_got_a_gradient(shared: Shared, case: str) -> None:
    # PyTorch's own answer, what the finding rests on: the online encoder's .grad is None at
    # every optimizer step, and its weights barely move (the moving average, applied to
    # itself, shrinks them) against a copy's
    run, healthy = field_run(shared, case), field_run(shared, case.replace(
        "byol_", "ok_byol_").replace("_shared", "_deepcopy"))
    for after, census in run.truth.optimizer_steps:
        assert all(census[(0, name)].state == NONE for name in ONLINE), after
    assert all(census[(0, "online_encoder.net.0")].state == NONZERO
               for _, census in healthy.truth.optimizer_steps)
    assert len(run.truth.optimizer_steps) == len(run.truth.steps) == 6
    assert moved(run) < moved(healthy) / 2


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("ok_")])
def test_look_alikes_stay_silent(shared: Shared, case: str) -> None:
    run = field_run(shared, case)
    assert [f"[{f.cause}] {f.module}: {f.message}" for f in run.problems] == []
    assert not [f for f in run.report.findings if f.cause == "shared-target"]


def test_a_layer_unused_by_design_is_named_in_the_wrapper_that_calls_it(shared: Shared) -> None:
    """byol-pytorch's wrapper runs the backbone in full for a hidden layer's output and throws
    the result away: the backbone's last layer never gets a gradient. The backbone is registered
    on the learner (``net``) and in the wrapper (``online_encoder.net``, whose calls these are):
    the finding names the wrapper's forward, not the learner's, nor nothing (before: silent, the
    calls' name holding no parameters of its own); and its target is a frozen copy of the
    wrapper, without ``.eval()`` advice for its BatchNorms."""
    run = field_run(shared, "byol_hidden_layer")
    [found] = run.problems
    assert (found.cause, found.severity, found.model, found.module, found.step) == (
        "no-grad", "warning", "learner", "online_encoder", 0)
    assert found.evidence["starved"] == ["online_encoder.net.5"]
    assert found.message.startswith("online_encoder (HiddenLayerWrapper): the gradient stops "
                                    "inside its forward: the output of online_encoder.net ")
    assert found.source is not None and "(HiddenLayerWrapper.forward)" in found.source
    [frozen] = [f for f in run.report.findings if f.cause == "frozen"]
    assert frozen.evidence["roles"]["copy"] == {"target_encoder": "online_encoder"}
    assert "frozen-bn-training" not in {f.cause for f in run.report.findings}
    # PyTorch's census: that layer's .grad is None at every optimizer step
    assert all(census[(0, "net.5")].state == NONE for _, census in run.truth.optimizer_steps)


def _frozen_covers(findings: list[Finding], names: list[str]) -> bool:
    """Whether ``frozen`` findings, however worded or grouped, cover every module of
    ``names``: by their module (and all below it) or their evidence's modules."""
    covered: set[str] = set()
    for f in findings:
        if f.cause == "frozen":
            covered |= set(f.evidence.get("modules") or ())
            covered |= {n for n in names if n == f.module or n.startswith(f.module + ".")}
    return set(names) <= covered


def test_a_freeze_in_the_first_forward_keeps_its_frozen_note(shared: Shared) -> None:
    # the backbone is frozen inside step 0's forward, after the module records said trainable:
    # a frozen backbone under a trained head, on purpose (no warning), and its note stays
    run = field_run(shared, "freeze_in_first_forward")
    assert [f"[{f.cause}] {f.module}: {f.message}" for f in run.problems] == []
    assert _frozen_covers(run.report.findings, ["backbone.0", "backbone.1", "backbone.5"])


@pytest.mark.parametrize("case", BUGS)
def test_a_target_frozen_in_the_first_forward_keeps_its_frozen_note(
        shared: Shared, case: str) -> None:
    run = field_run(shared, case)
    assert _frozen_covers(run.report.findings, ONLINE)


@pytest.mark.parametrize("case", CASES)
def test_every_gradient_claim_agrees_with_pytorch_over_the_whole_run(
        shared: Shared, case: str) -> None:
    run = field_run(shared, case)
    wrong = disagreements(run.log, run.report.findings, run.truth)
    assert not wrong, "\n".join(wrong)
    if case in BUGS:  # the claim that matters is made, and is true
        said = claims(run.report.findings, {})
        assert [(c.model, c.modules, c.state) for c in said if "[shared-target]" in c.source
                ] == [("learner", tuple(ONLINE), NONE)]


def test_a_wrong_claim_is_caught(shared: Shared) -> None:
    # the comparison is not vacuous: a frozen note on the trained predictor contradicts the
    # census at every backward pass and optimizer step
    run = field_run(shared, "byol_lazy_shared")
    wrong = Finding("frozen", "note", "learner", "online_predictor", None, "made up")
    found = disagreements(run.log, [*run.report.findings, wrong], run.truth)
    assert len(found) == 3 * 6 * 2  # 3 modules with parameters, 6 passes, 6 optimizer steps
    assert all("check [frozen] note online_predictor: made up: says no gradient" in x
               for x in found)


def test_the_census_file_holds_both_units(shared: Shared) -> None:
    run = field_run(shared, "ok_byol_lazy_deepcopy")
    data = json.loads(Path(str(run.log).replace(".jsonl", ".truth.json")).read_text())
    assert len(data["steps"]) == len(data["frozen"]) == 6
    assert [after for after, _ in data["optimizer_steps"]] == [1, 2, 3, 4, 5, 6]

"""``shared-target`` on hand-built logs: a module held under two names, frozen though an
optimizer holds it, run with gradients and under no_grad in one step (a BYOL target that is
the online encoder itself), named from its module record's aliases or from the freeze the run
saw; each condition's absence stays silent; a freeze at the first step's end, before any
backward, is a frozen note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .logbuild import C, findings, signal, summary, write_log


def modules(trainable: int = 0, aliases: list[str] | None = None) -> list[tuple[Any, ...]]:
    return [("", "BYOL", 0), ("online", "Encoder", 0, 0, aliases), ("online.fc", "Linear", 40,
            trainable), ("head", "Linear", 18)]


def step(target: bool = True) -> list[C]:
    """The online encoder with gradients on (frozen: no backward), the head, the target."""
    calls = [C("online.fc", g_out=None, g_in=None), C("online", g_out=None, g_in=None),
             C("head", g_in=None)]
    if target:
        calls += [C("online.fc", no_grad=True), C("online", no_grad=True)]
    return [*calls, C("")]


def held(frozen: bool = True) -> Any:
    return signal("optimizers", held=["head"], not_held=[],
                  **({"frozen_held": ["online.fc"]} if frozen else {}))


def test_a_target_registered_as_the_online_encoder(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [step()] * 3, modules=modules(aliases=["target"]),
                     optimizer=False, signals=[held()])
    found = [f for f in findings(path) if f.cause == "shared-target"]
    assert [(f.severity, f.module, f.step) for f in found] == [("warning", "online", 0)]
    assert found[0].evidence == {"modules": ["online.fc"], "aliases": {"online": "target"},
                                 "steps": [0, 1, 2]}
    assert "target = copy.deepcopy(online)" in found[0].hint


def test_a_target_that_a_freeze_in_the_first_forward_reached(tmp_path: Path) -> None:
    # trainable in the module record; the first step's end saw it frozen, under two names
    path = write_log(tmp_path / "log.jsonl", [step()] * 3, modules=modules(trainable=40),
                     optimizer=False, signals=[
                         held(), signal("trainable-changed", frozen=["online.fc"], unfrozen=[],
                                        aliases={"online.fc": ["target.fc"]})])
    assert summary(path) == [("shared-target", "warning", "online", 0),
                             ("frozen", "note", "online.fc", None)]


def test_no_optimizer_holds_it(tmp_path: Path) -> None:
    """A frozen feature network under two names (a perceptual loss): frozen on purpose."""
    path = write_log(tmp_path / "log.jsonl", [step()] * 3, modules=modules(aliases=["target"]),
                     optimizer=False, signals=[held(frozen=False)])
    assert "shared-target" not in [f.cause for f in findings(path)]


def test_one_name_only(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [step()] * 3, modules=modules(), optimizer=False,
                     signals=[held()])
    assert "shared-target" not in [f.cause for f in findings(path)]


def test_never_run_under_no_grad(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [step(target=False)] * 3,
                     modules=modules(aliases=["target"]), optimizer=False, signals=[held()])
    assert "shared-target" not in [f.cause for f in findings(path)]


def test_a_freeze_before_any_backward_is_a_frozen_note(tmp_path: Path) -> None:
    # frozen inside step 0's forward, after its module record said trainable: frozen from the
    # start, not frozen during the run, and not a lost gradient
    path = write_log(tmp_path / "log.jsonl", [step(target=False)] * 3,
                     modules=modules(trainable=40), optimizer=False, signals=[
                         held(), signal("trainable-changed", frozen=["online.fc"], unfrozen=[])])
    assert summary(path) == [("frozen", "note", "online.fc", None)]

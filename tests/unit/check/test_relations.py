"""How models of one structure relate (``twins`` signals) on hand-built logs: a model trained
on from its EMA's weights, a target copied at every step, an EMA that never changes; and their
healthy look-alikes: an EMA that follows, weights swapped in and restored, a target copied
every other step, a frozen reference copy, the best weights reloaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hooktrace.log import schema

from .logbuild import CHAIN, C, chain, findings, signal, write_log

STEPS = 6


def twins(step: int, *, same: tuple[str, ...] = (), changed: tuple[str, ...] = ("a", "b"),
          unchanged: tuple[str, ...] = (), **more: Any) -> schema.Signal:
    """Models ``a`` (the log's model 0, trained from step 1 on) and ``b`` (model 1)."""
    first = step == 0
    return signal("twins", step, models=["a", "b"], same=[list(same)] if same else [],
                  changed=[] if first else list(changed),
                  unchanged=[] if first else list(unchanged),
                  trained=[] if first else ["a"], **more)


def renamed(value: Any, b: str) -> Any:
    if isinstance(value, list):
        return [renamed(v, b) for v in value]
    return b if value == "b" else value


def run(tmp_path: Path, signals: list[schema.Signal], b: str = "b") -> list[tuple[str, str]]:
    """The relation findings of a log of models ``a`` and ``b`` (named ``b`` here)."""
    signals = [signal("twins", s.step, **{k: renamed(v, b) for k, v in s.detail.items()})
               for s in signals]
    steps = [chain() for _ in range(STEPS)]
    path = write_log(tmp_path / "log.jsonl", steps, model="a", signals=signals,
                     others=[(b, CHAIN)])
    return [(f.cause, f.model) for f in findings(path) if f.cause in (
        "weights-replaced", "copied-every-step", "copy-not-updated")]


def test_an_ema_copied_into_the_model(tmp_path: Path) -> None:
    signals = [twins(s, **({"same": ("a", "b"), "replaced": ["a"]} if s in (2, 4) else {}))
               for s in range(STEPS)]
    assert run(tmp_path, signals) == [("weights-replaced", "a")]


def test_weights_swapped_in_and_restored_or_an_ema_that_follows(tmp_path: Path) -> None:
    assert run(tmp_path, [twins(s) for s in range(STEPS)]) == []


def test_the_best_weights_reloaded_from_a_snapshot(tmp_path: Path) -> None:
    # b changes at one look only (a snapshot taken once): not a copy that follows
    signals = [twins(0), twins(1, changed=("a", "b")),
               *(twins(s, changed=("a",), unchanged=("b",)) for s in (2, 3)),
               twins(4, same=("a", "b"), changed=("a",), unchanged=("b",), replaced=["a"]),
               twins(5, changed=("a",), unchanged=("b",))]
    assert run(tmp_path, signals) == []


def test_a_target_copied_at_every_step(tmp_path: Path) -> None:
    signals = [twins(0), *(twins(s, same=("a", "b")) for s in range(1, STEPS))]
    assert run(tmp_path, signals) == [("copied-every-step", "b")]


def test_a_target_copied_every_other_step(tmp_path: Path) -> None:
    signals = [twins(s, same=("a", "b") if s % 2 else ()) for s in range(STEPS)]
    assert run(tmp_path, signals) == []


def never_changes(s: int) -> schema.Signal:
    return twins(s, same=("a", "b")) if s == 0 else twins(s, changed=("a",), unchanged=("b",))


def test_an_ema_that_never_changes(tmp_path: Path) -> None:
    signals = [never_changes(s) for s in range(STEPS)]
    assert run(tmp_path, signals, b="model_ema") == [("copy-not-updated", "model_ema")]


def test_a_frozen_reference_copy_that_never_changes(tmp_path: Path) -> None:
    # the same relation, with no name that says it follows: a reference model (RLHF's KL term)
    signals = [never_changes(s) for s in range(STEPS)]
    assert run(tmp_path, signals, b="ref_model") == []


def test_a_frozen_copy_of_another_model_is_named_by_its_model(tmp_path: Path) -> None:
    frozen = [(name, cls, params, 0) for name, cls, params in CHAIN]
    steps = [[*chain(), *(C(c.name, no_grad=True, g_out=None, model=1) for c in chain())]
             for _ in range(3)]
    path = write_log(tmp_path / "log.jsonl", steps, model="model", others=[("ema", frozen)])
    (note,) = [f for f in findings(path) if f.cause == "frozen"]
    assert "(root) (Net), a frozen copy of model 'model':" in note.message

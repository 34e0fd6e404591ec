"""Judging in the units training uses (issue 38): zero weights before the first optimizer step
with lr > 0 (the ``optimizer-steps`` signal), and modules trained in turns; each beside a
look-alike that stays a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .logbuild import C, signal, summary, write_log


def zero_weights(n: int = 3) -> list[list[C]]:
    """fc2's weights are zero: it passes back nothing, fc1 gets an exactly-zero gradient."""
    return [[C("fc1", g_out=0.0, g_in=None), C("act", g_out=0.0, g_in=0.0),
             C("fc2", g_in=0.0), C("")] for _ in range(n)]


def steps(moving: int | None, **detail: Any) -> list[Any]:
    return [signal("optimizer-steps", 1, optimizer="AdamW", count=2, after=[1, 3],
                   lr=[0.0, 1e-3], moving=moving, held=["fc1", "fc2"], **detail)]


def test_zero_weights_before_the_first_step_with_lr_are_a_note(tmp_path: Path) -> None:
    """Every judged pass (0-2) before the optimizer first stepped with lr > 0 (after pass 3):
    its weights have not moved yet."""
    path = write_log(tmp_path / "log.jsonl", zero_weights(), signals=steps(3))
    assert summary(path) == [("zero-gradient", "note", "fc2", 0)]


def test_zero_weights_after_a_step_with_lr_are_a_warning(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", zero_weights(), signals=steps(1))
    assert summary(path) == [("zero-gradient", "warning", "fc2", 0)]


def test_zero_weights_no_step_moves_are_a_warning(tmp_path: Path) -> None:
    """lr 0 all along, no optimizer-steps signal, or one that holds other modules: nothing
    says the weights ever move."""
    for signals in (steps(None), [], [signal("optimizer-steps", 1, optimizer="SGD", count=2,
                                             after=[1, 3], lr=[0.1, 0.1], moving=1,
                                             held=["fc1"])]):
        path = write_log(tmp_path / "log.jsonl", zero_weights(), signals=signals)
        assert summary(path) == [("zero-gradient", "warning", "fc2", 0)], signals


def test_a_head_that_misses_the_gradient_in_turns_is_not_detached(tmp_path: Path) -> None:
    """fc2 gets no gradient in pass 1 and gets it again in pass 2 (losses in turns), where the
    optimizer steps after passes 0 and 2: each of its steps had fc2's gradient."""
    turns = [[C("fc1", g_in=None), C("act"), C("fc2", g_out=None if step == 1 else 0.5),
              C("")] for step in range(3)]
    windows = [signal("optimizer-steps", 0, optimizer="SGD", count=2, after=[0, 2],
                      lr=[0.1, 0.1], moving=0, held=["fc1", "fc2"])]
    path = write_log(tmp_path / "log.jsonl", turns, signals=windows)
    assert [f for f in summary(path) if f[1] != "note"] == []
    # a step after every pass: pass 1's window has no gradient for fc2
    every = [signal("optimizer-steps", 0, optimizer="SGD", count=3, after=[0, 1, 2],
                    lr=[0.1] * 3, moving=0, held=["fc1", "fc2"])]
    path = write_log(tmp_path / "every.jsonl", turns, signals=every)
    assert [f[0] for f in summary(path) if f[1] != "note"] == ["no-grad"]


def test_a_head_that_stops_getting_the_gradient_is_detached(tmp_path: Path) -> None:
    """fc2 gets a gradient in pass 0, then never again: not turns."""
    lost = [[C("fc1", g_in=None), C("act"), C("fc2", g_out=None if step else 0.5), C("")]
            for step in range(3)]
    path = write_log(tmp_path / "log.jsonl", lost)
    assert [f[0] for f in summary(path) if f[1] != "note"] == ["no-grad"]

"""The loss ledger judged (``losses.diverged``): a loss orders of magnitude up without NaN/Inf
that stays up is said; one that rises for a few steps and falls, one that may be negative and
a short run are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from hooktrace.log.schema import Signal

from .logbuild import findings, healthy, signal, write_log


def ledger(values: list[float]) -> list[Signal]:
    return [signal("loss-values", 0, models=[0], steps=list(range(len(values))),
                   values=values, passes=len(values), every=1)]


def test_a_loss_up_a_thousandfold_that_stays_up_is_said(tmp_path: Path) -> None:
    values = [1.4, 2100.0, 1900.0, 700.0, 300.0, 80.0, 40.0, 50.0, 20.0, 30.0]
    [f] = findings(write_log(tmp_path / "log.jsonl", healthy(), signals=ledger(values)))
    assert (f.kind, f.cause, f.severity, f.module, f.step) == (
        "loss", "loss-diverged", "warning", "", 1)
    assert f.evidence["peak"] == 2100.0


@pytest.mark.parametrize("values", [
    [1.4, 18.6, 23.3, 10.9, 5.0, 1.8, 0.4, 0.2, 0.1, 0.1],  # up 16x, then converges
    [1.4, 200.0, 150.0, 90.0, 2.0, 1.0, 0.5, 0.3, 0.2, 0.1],  # a spike, then down for good
    [1.4, -200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0],  # may be negative: not judged
    [1.4, 2000.0, 3000.0, 4000.0],  # too short to say
])
def test_healthy_look_alikes_are_silent(tmp_path: Path, values: list[float]) -> None:
    assert findings(write_log(tmp_path / "log.jsonl", healthy(), signals=ledger(values))) == []


def test_a_loss_nan_or_inf_from_its_first_pass_with_finite_gradients_is_said(
        tmp_path: Path) -> None:
    values: list[float | None] = [None] * 10  # the ledger's null: NaN/Inf
    [f] = findings(write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("loss-values", 0, models=[0], steps=list(range(10)), values=values, passes=10,
               every=1)]))
    assert (f.kind, f.cause, f.severity, f.module, f.step) == (
        "nonfinite", "nonfinite-forward", "warning", "", 0)


def test_a_loss_that_grows_into_inf_is_no_loss_made_nonfinite(tmp_path: Path) -> None:
    # a run that diverges (a loss scaled twice overflowing float32) is told by its gradients
    values = [5.9e9, 3.2e14, 3.9e24, None]
    assert [f for f in findings(write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("loss-values", 0, models=[0], steps=[0, 1, 2, 3], values=values, passes=4,
               every=1)])) if f.kind == "nonfinite"] == []


def test_a_loss_that_falls_below_zero_without_slowing_is_said(tmp_path: Path) -> None:
    values = [-1.6 - 0.003 * i * i for i in range(20)]  # kl_div on raw scores: no floor
    [f] = findings(write_log(tmp_path / "log.jsonl", healthy(), signals=ledger(values)))
    assert (f.kind, f.cause, f.severity, f.module, f.step) == (
        "loss", "loss-diverged", "warning", "", 0)


@pytest.mark.parametrize("values", [
    [0.5 - 2.5 * (1 - 0.7 ** i) for i in range(20)],  # a Gaussian NLL below zero, levelling
    [-0.1, -0.4, 0.2, -0.8, -0.3, -1.0, -0.2, -0.9, -0.6, -0.7],  # an actor's, noisy
    [-0.3 * i for i in range(1, 6)],  # too short to say
])
def test_negative_losses_with_a_floor_are_silent(tmp_path: Path, values: list[float]) -> None:
    assert findings(write_log(tmp_path / "log.jsonl", healthy(), signals=ledger(values))) == []

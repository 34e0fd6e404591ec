"""Gradient magnitudes on hand-built logs: parameter-gradient norms past --vanishing and
--exploding, activation-gradient norms that grow or fall by --orders across the network, and the
notes for a passing moment; thresholds move each finding in and out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hooktrace.check.findings import Thresholds

from .logbuild import SAME, C, findings, healthy, summary, write_log

STACK = [("", "Deep", 0)] + [(f"l{i}", "Linear", 10) for i in range(4)]
UNIT_NORMS = {s: {f"l{i}": 1.0 for i in range(4)} for s in range(3)}


def stack(g_outs: list[float]) -> list[C]:
    """l0..l3 then the root; ``g_outs``: what each layer receives, l0 first (its gain is what
    the layer before it receives over its own)."""
    calls = [C("l0", g_out=g_outs[0], g_in=None)]
    calls += [C(f"l{i}", g_out=g, g_in=g_outs[i - 1]) for i, g in enumerate(g_outs) if i]
    return [*calls, C("", g_out=g_outs[-1], g_in=None)]


def norms(value: float, steps: range = range(3), **more: float) -> dict[int, dict[str, float]]:
    return {s: {"fc1": value, "fc2": value, **more} for s in steps}


@pytest.mark.parametrize(("value", "thresholds", "want"), [
    (1e5, Thresholds(), [("exploding", "warning", "fc1", 0)]),
    (1e5, Thresholds(exploding=1e6), []),
    (1e3, Thresholds(exploding=100), [("exploding", "warning", "fc1", 0)]),
    (1e-9, Thresholds(), [("vanishing", "warning", "fc1", 0)]),
    (1e-9, Thresholds(vanishing=1e-10), []),
    (1e-5, Thresholds(vanishing=1e-4), [("vanishing", "warning", "fc1", 0)]),
    (0.5, Thresholds(), []),
])
def test_parameter_norms_against_the_thresholds(tmp_path: Path, value: float,
                                                thresholds: Thresholds,
                                                want: list[tuple[str, str, str, int]]) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), params=norms(value))
    assert summary(path, thresholds=thresholds) == want


def test_exploding_lists_each_module_and_its_norm(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     params={s: {"fc1": 1e5, "fc2": 2e5} for s in range(3)})
    (f,) = findings(path)
    assert f.message == "2 modules with a parameter-gradient norm above 10000: fc1 1e+05, fc2 2e+05"
    assert f.evidence == {"grad_norm": {"fc1": 1e5, "fc2": 2e5}}


def test_past_the_threshold_in_one_step_of_three_is_a_note(tmp_path: Path) -> None:
    """A zero-initialised head's first step: passing, not lasting."""
    path = write_log(tmp_path / "log.jsonl", healthy(), params={0: {"fc1": 1e5}})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("exploding", "note", "fc1", 0)
    assert "in a few of the steps only (step 0)" in f.message
    assert f.evidence == {"grad_norm": {"fc1": 1e5}, "steps": [0]}


def test_past_the_threshold_in_the_last_two_steps_lasts(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(4),
                     params={2: {"fc1": 1e5}, 3: {"fc1": 1e5}})
    assert summary(path) == [("exploding", "warning", "fc1", 2)]


def test_exactly_zero_parameter_gradients_are_never_excused(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), params={s: {"fc1": 0.0}
                                                                 for s in range(3)})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("zero-gradient", "warning", "fc1", 0)
    assert f.evidence == {"modules": ["fc1"], "steps": [0, 1, 2]}
    # no threshold makes an exact zero healthy
    assert summary(path, thresholds=Thresholds(vanishing=0.0)) == summary(path)


def test_a_small_norm_after_a_larger_one_nearer_the_input_is_bypassed(tmp_path: Path) -> None:
    """fc2's norm is tiny while fc1, before it in forward, gets a usual one: the gradient is
    small in fc2's own branch (a layer scale), not lost on its way: a note."""
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     params={s: {"fc1": 0.5, "fc2": 1e-9} for s in range(3)})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module) == ("vanishing", "note", "fc2")
    assert "while modules that run before them got larger gradients" in f.message


@pytest.mark.parametrize(("g_outs", "orders", "want"), [
    ([1e5, 1e3, 1e2, 1.0], 4.0, [("exploding", "warning", "l0", 0)]),
    ([1e5, 1e3, 1e2, 1.0], 5.5, []),
    ([1e-5, 1e-3, 1e-2, 1.0], 4.0, [("vanishing", "warning", "l0", 0)]),
    ([1e-5, 1e-3, 1e-2, 1.0], 6.0, []),
    ([1e-2, 1e-1, 0.5, 1.0], 4.0, []),
    ([1e-2, 1e-1, 0.5, 1.0], 1.5, [("vanishing", "warning", "l0", 0)]),
])
def test_activation_gradient_profile_against_orders(tmp_path: Path, g_outs: list[float],
                                                    orders: float,
                                                    want: list[tuple[str, str, str, int]]
                                                    ) -> None:
    path = write_log(tmp_path / "log.jsonl", [stack(g_outs)] * 3, modules=STACK,
                     params=UNIT_NORMS)
    assert summary(path, thresholds=Thresholds(orders=orders)) == want


def test_the_profile_finding_says_where_from_and_to(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [stack([1e5, 1e3, 1e2, 1.0])] * 3, modules=STACK,
                     params=UNIT_NORMS)
    (f,) = findings(path)
    assert f.message == ("gradient norms grow by 5.0 orders of magnitude from l3 (1) back to "
                         "l0 (1e+05) at step 0")
    assert [p["module"] for p in f.evidence["profile"]] == ["l3", "l2", "l1", "l0"]


def test_two_trainable_modules_make_no_profile(tmp_path: Path) -> None:
    """A profile needs three modules with parameters: fc1 and fc2 differ by 6 orders, each
    layer passing back 1e-3 of what it gets (no boundary), and no finding from the profile
    (their parameter norms are set within the thresholds)."""
    steps = [[C("fc1", g_out=1e-6, g_in=None), C("act", g_out=1e-3, g_in=1e-6),
              C("fc2", g_out=1.0, g_in=1e-3), C("", g_out=1.0, g_in=None)]] * 3
    path = write_log(tmp_path / "log.jsonl", steps, params=norms(0.5))
    assert [f.cause for f in findings(path)] == []


def test_the_profile_is_judged_within_one_model(tmp_path: Path) -> None:
    """A generator whose gradients are 5 orders below its discriminator's in the same pass (a
    GAN's generator step): each model's profile is flat, no finding; the same norms in one
    model fall by 5 orders."""
    generator = [("", "Gen", 0)] + [(f"g{i}", "Linear", 10) for i in range(3)]
    critic = [("", "Disc", 0)] + [(f"d{i}", "Linear", 10) for i in range(3)]
    gen = [C("g0", g_out=1e-3, g_in=None), C("g1", g_out=1e-3), C("g2", g_out=1e-3),
           C("", g_out=1e-3, g_in=None)]
    disc = [C(f"d{i}", g_out=1e2, g_in=1e-3 if i == 0 else SAME, model=1) for i in range(3)]
    steps = [[*gen, *disc, C("", g_out=1e2, g_in=1e-3, model=1)]] * 3
    path = write_log(tmp_path / "log.jsonl", steps, modules=generator, model="generator",
                     others=[("discriminator", critic)])
    assert summary(path) == []
    one = [("", "Deep", 0)] + [(f"l{i}", "Linear", 10) for i in range(6)]
    path = write_log(tmp_path / "one.jsonl", [stack([1e-3] * 3 + [1e2] * 3)] * 3, modules=one)
    assert [f[0] for f in summary(path)] == ["vanishing"]

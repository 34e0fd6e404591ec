"""Evaluation copies (issue 38): modules with trainable parameters that ran only under
``no_grad`` and that no optimizer holds (an EMA copy kept with ``requires_grad=True`` inside the
module that trains) are one note, not a gradient lost; the look-alike that an optimizer holds
(a forward run under ``no_grad`` by mistake) stays a warning."""

from __future__ import annotations

from pathlib import Path

from .logbuild import C, findings, signal, summary, write_log


def ema_beside(n: int = 3) -> list[list[C]]:
    """fc1 (through act) trains; fc2 runs under no_grad in every step and gets nothing."""
    return [[C("fc1", g_in=None), C("act"), C("fc2", g_out=None, g_in=None, no_grad=True),
             C("")] for _ in range(n)]


def held(*names: str, not_held: tuple[str, ...] = ()) -> list[object]:
    return [signal("optimizers", 0, held=list(names), not_held=list(not_held))]


def test_a_copy_no_optimizer_holds_is_one_note(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", ema_beside(), signals=held("fc1", not_held=("fc2",)),
                     optimizer=False)
    assert summary(path) == [("evaluation-copy", "note", "fc2", None)]


def test_a_module_an_optimizer_holds_under_no_grad_stays_a_warning(tmp_path: Path) -> None:
    """The root's forward runs fc2 under no_grad: the boundary is named there."""
    path = write_log(tmp_path / "log.jsonl", ema_beside(), signals=held("fc1", "fc2"),
                     optimizer=False)
    assert [f[:3] for f in summary(path) if f[1] != "note"] == [
        ("no-grad-under-no_grad", "warning", "")]


def test_without_an_optimizer_nothing_says_it_is_a_copy(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", ema_beside(), optimizer=False)
    assert "evaluation-copy" not in {f[0] for f in summary(path)}
    assert [f[1] for f in summary(path) if f[0] == "no-grad-under-no_grad"] == ["warning"]


def test_a_copy_that_once_ran_with_gradients_is_judged(tmp_path: Path) -> None:
    """fc2 ran with gradients on in step 0 and got them: not an evaluation copy; under no_grad
    in the steps after, while no optimizer holds it: judged as before."""
    steps = ema_beside()
    steps[0][2] = C("fc2")
    path = write_log(tmp_path / "log.jsonl", steps, signals=held("fc1", not_held=("fc2",)),
                     optimizer=False)
    assert "evaluation-copy" not in {f[0] for f in summary(path)}


def test_a_copy_validated_in_eval_mode_with_gradients_on_is_one_note(tmp_path: Path) -> None:
    """The copy validated after .eval() with gradients on (no no_grad): its calls get no
    backward; no optimizer holds it. The note says how it ran."""
    steps = [[C("fc1", g_in=None), C("act"), C("fc2", g_out=None, g_in=None, eval_mode=True),
              C("")] for _ in range(3)]
    path = write_log(tmp_path / "log.jsonl", steps, signals=held("fc1", not_held=("fc2",)),
                     optimizer=False)
    [f] = findings(path)
    assert (f.cause, f.severity, f.module) == ("evaluation-copy", "note", "fc2")
    assert "ran only in eval mode, with no backward, and no optimizer holds them" in f.message


def test_a_copy_an_optimizer_holds_in_eval_mode_stays_a_warning(tmp_path: Path) -> None:
    steps = [[C("fc1", g_in=None), C("act"), C("fc2", g_out=None, g_in=None, eval_mode=True),
              C("")] for _ in range(3)]
    path = write_log(tmp_path / "log.jsonl", steps, signals=held("fc1", "fc2"), optimizer=False)
    assert [f[:3] for f in summary(path) if f[1] != "note"] == [("no-grad", "warning", "")]

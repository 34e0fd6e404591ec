"""Hooks that pile up and custom autograd Functions on hand-built logs: the ``hooks-growing``
and ``function-backward`` signals as findings; a backward that differs from its forward's
gradient on purpose (a gradient modifier, a straight-through estimator) only a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from .logbuild import findings, healthy, signal, summary, write_log

GROWING = {"hooks": "gradient", "counts": [2, 4, 6], "steps": [0, 1, 2]}


def test_growing_hooks_of_one_kind_and_step_are_one_finding(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[
        signal("hooks-growing", 0, "fc1", **GROWING),
        signal("hooks-growing", 0, "fc2", **GROWING),
        signal("hooks-growing", 0, "fc2", hooks="forward", counts=[1, 2, 3], steps=[0, 1, 2])])
    assert summary(path) == [("hooks-growing", "warning", "fc1", 0),
                             ("hooks-growing", "warning", "fc2", 0)]
    gradient, forward = findings(path)
    assert gradient.evidence["modules"] == ["fc1", "fc2"]
    assert gradient.message.startswith("fc1, fc2: the gradient hooks on their parameters grew "
                                       "at every recorded step (2, 4, 6 at steps 0, 1, 2)")
    assert forward.message.startswith("fc2 (Linear): the forward hooks grew")
    assert "register_forward_hook once, before the loop" in forward.hint


def function(**detail: object) -> object:
    return signal("function-backward", 0, "act", function="Mine", file="net.py", line=12,
                  **detail)


OFF = {"twice": "double", "elements": 4, "off": 4, "identity": False, "flat": False}


# the log holds what the tracer measured; check decides what it means
@pytest.mark.parametrize(("verdict", "detail", "severity", "says"), [
    ("ignores-grad", {"twice": "same"}, "warning", "whatever grad_output it gets"),
    ("scaled", {**OFF, "ratio": 100.0}, "warning", "gives 100 times"),
    ("mismatch", {**OFF, "off": 3, "numeric": 0.25, "backward": 0.5}, "warning",
     "at 3 of 4 elements compared (worst: 0.5 where the forward's slope is 0.25)"),
    ("reversed", {**OFF, "ratio": -2.0}, "warning", "sign flipped"),
    ("modifier", {**OFF, "ratio": -1.0, "identity": True}, "note", "multiplies it by -1"),
    ("modifier", {**OFF, "identity": True}, "note", "not by one factor"),
    ("surrogate", {**OFF, "flat": True}, "note", "straight-through estimator"),
    ("nonlinear", {"twice": "other"}, "note", "not linear in grad_output"),
])
def test_a_function_s_backward(tmp_path: Path, verdict: str, detail: dict[str, object],
                               severity: str, says: str) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[function(**detail)])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("function-backward", severity, "act", 0)
    assert f.message.startswith("the autograd.Function Mine (net.py:12), used in act (ReLU): "
                                "its backward ")
    assert says in f.message
    assert f.evidence["verdict"] == verdict

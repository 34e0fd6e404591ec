"""A finding that follows from another comes after it, whatever the sort put between them: the
cause reads first, in the text report and in ``--json`` alike (one rank's log or several)."""

from __future__ import annotations

from hooktrace.check.checks import after_causes
from hooktrace.check.findings import ERROR, Finding


def finding(kind: str, model: str = "model", **evidence: str) -> Finding:
    return Finding(kind, ERROR, model, "2", 0, kind, dict(evidence))


def test_a_consequence_moves_after_its_cause() -> None:
    backward = finding("nonfinite-backward", follows="nonfinite-forward")
    crash, forward = finding("forward-error"), finding("nonfinite-forward")
    assert after_causes([backward, crash, forward]) == [crash, forward, backward]


def test_a_cause_in_another_model_or_none_leaves_it_in_place() -> None:
    backward = finding("nonfinite-backward", follows="nonfinite-forward")
    other = finding("nonfinite-forward", model="teacher")
    assert after_causes([backward, other]) == [backward, other]
    alone = finding("nonfinite-backward")
    assert after_causes([alone, other]) == [alone, other]

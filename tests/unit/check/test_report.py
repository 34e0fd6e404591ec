"""The report of ``check`` as text and JSON, from findings made by hand: errors, then warnings,
then notes, whatever order they come in; the summary line's counts and words; what each
finding's lines say (where, evidence, the operation's line, source, hint, ranks)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooktrace.check.findings import (
    ERROR,
    NOTE,
    WARNING,
    Finding,
    Report,
    names_text,
    steps_text,
)
from hooktrace.check.report import to_json, to_text, where


def finding(kind: str, severity: str, module: str = "fc1", step: int | None = 0,
            **more: Any) -> Finding:
    return Finding(kind, severity, "net", module, step, f"{kind} happened", **more)


def report(*findings: Finding, warnings: list[str] | None = None) -> Report:
    return Report(list(findings), warnings or [], steps=3, events=24)


def test_sections_come_errors_warnings_notes_whatever_the_input_order() -> None:
    text = to_text(report(finding("frozen", NOTE), finding("unused", WARNING),
                          finding("nonfinite-forward", ERROR), finding("no-grad", WARNING)),
                   "run.jsonl")
    lines = text.splitlines()
    assert lines[0] == "hooktrace check run.jsonl: 3 steps, 24 events"
    headings = [line for line in lines if line and not line.startswith(" ")][1:-1]
    assert headings == ["Errors (1)", "Warnings (2)", "Notes (1)"]
    kinds = [line.split("]")[0][3:] for line in lines if line.startswith("  [")]
    assert kinds == ["nonfinite-forward", "unused", "no-grad", "frozen"]
    assert lines[-1] == "3 problems (1 error, 2 warnings), 1 note"


@pytest.mark.parametrize(("severities", "last"), [
    ([], "No problems found (0 notes)."),
    ([NOTE], "No problems found (1 note)."),
    ([NOTE, NOTE], "No problems found (2 notes)."),
    ([ERROR], "1 problem (1 error, 0 warnings), 0 notes"),
    ([WARNING, WARNING, NOTE], "2 problems (0 errors, 2 warnings), 1 note"),
    ([ERROR, ERROR, WARNING, NOTE, NOTE], "3 problems (2 errors, 1 warning), 2 notes"),
])
def test_the_summary_line(severities: list[str], last: str) -> None:
    rep = report(*(finding("unused", s) for s in severities))
    assert to_text(rep, "x").splitlines()[-1] == last
    assert len(rep.problems) == sum(s != NOTE for s in severities)


def test_the_first_line_counts_in_the_singular() -> None:
    rep = Report([], [], steps=1, events=1)
    assert to_text(rep, "x").splitlines()[0] == "hooktrace check x: 1 step, 1 event"


def test_reader_warnings_and_capture_come_before_the_findings() -> None:
    rep = Report([finding("unused", WARNING)], ["x has no end record"], 3, 24,
                 captured="x.capture (2 files)")
    lines = to_text(rep, "x").splitlines()
    assert lines[1:3] == ["warning: x has no end record",
                          "captured tensors (torch.load): x.capture (2 files)"]


@pytest.mark.parametrize(("model", "module", "step", "want"), [
    ("net", "fc1", 0, "fc1 · model 'net' · step 0"),
    ("net", "", 3, "(root) · model 'net' · step 3"),
    ("net", "fc1", None, "fc1 · model 'net' · all steps"),
    ("", "", None, "before any model ran"),
    ("", "", 2, "step 2"),
])
def test_where(model: str, module: str, step: int | None, want: str) -> None:
    assert where(Finding("stopped", ERROR, model, module, step, "m")) == want


def test_a_findings_lines_in_order() -> None:
    f = finding("no-grad", WARNING, evidence={
        "starved": ["a", "b"], "steps": [0, 1], "follows": "x",
        "op": {"op": ".detach()", "line": "t.py:3", "code": "y = x.detach()"}},
        hint="look at it", source="t.py:1 (Net.forward)")
    lines = to_text(report(f), "x").splitlines()
    at = lines.index("  [no-grad] fc1 · model 'net' · step 0")
    assert lines[at + 1:at + 6] == [
        "    no-grad happened",
        "    evidence: starved: ['a', 'b']; steps: [0, 1]",  # op, follows: not evidence lines
        "    at: t.py:3: y = x.detach()",
        "    source: t.py:1 (Net.forward)",
        "    hint: look at it"]


def test_a_notes_evidence_is_not_printed() -> None:
    f = finding("frozen", NOTE, evidence={"params": 10})
    assert "evidence" not in to_text(report(f), "x")


def test_evidence_of_nan_outputs_and_gradients() -> None:
    f = finding("nonfinite-forward", ERROR, evidence={
        "call": 0, "outputs": [{"index": 0, "shape": [4, 8], "dtype": "float16", "nan": 0,
                                "inf": 3}],
        "grad_output": [{"index": 1, "nan": 2, "inf": 0}], "changed": {}, "rerun": "cmd"})
    lines = to_text(report(f), "x").splitlines()
    assert ("    evidence: call: 0; outputs: output 0 [4, 8] float16: 0 NaN, 3 Inf; "
            "grad_output 1: 2 NaN, 0 Inf") in lines
    assert lines[-3] == "    to see the operation and its line: cmd"


def test_a_long_profile_is_thinned_to_eight() -> None:
    profile = [{"module": f"l{i}", "grad_output_norm": float(i + 1)} for i in range(20)]
    f = finding("vanishing", WARNING, evidence={"profile": profile, "grad_norm": {"l0": 1.0}})
    line = next(x for x in to_text(report(f), "x").splitlines() if "evidence" in x)
    assert line.count(" -> ") == 7
    assert line.startswith("    evidence: profile: l0 1 -> ") and line.endswith("l19 20")
    assert "grad_norm" not in line


@pytest.mark.parametrize(("ranks", "kind", "said"), [
    ([1], "unused", " · rank 1 only"),
    ([0, 2], "unused", " · ranks 0, 2 only"),
    ([0, 1], "rank-divergence", " · ranks 0, 1"),
])
def test_rank_local_findings_say_their_ranks(ranks: list[int], kind: str, said: str) -> None:
    f = finding(kind, ERROR, ranks=ranks)
    assert f"  [{kind}] fc1 · model 'net' · step 0{said}" in to_text(report(f), "x")


def test_json_holds_every_finding_and_counts_problems() -> None:
    found = [finding("no-grad", ERROR, evidence={"x": 1}), finding("unused", NOTE, step=None),
             finding("frozen", WARNING, ranks=[1])]
    data = json.loads(to_json(report(*found, warnings=["w"])))
    assert data["problems"] == 2
    assert (data["steps"], data["events"], data["warnings"]) == (3, 24, ["w"])
    assert [f["cause"] for f in data["findings"]] == ["no-grad", "unused", "frozen"]  # as given
    assert [f["kind"] for f in data["findings"]] == ["gradient-flow", "calls", "update"]
    assert data["findings"][0] == {
        "kind": "gradient-flow", "cause": "no-grad", "severity": "error", "model": "net",
        "module": "fc1", "step": 0,
        "message": "no-grad happened", "evidence": {"x": 1}, "hint": "", "ranks": None,
        "source": None}
    assert data["findings"][1]["step"] is None
    assert data["findings"][2]["ranks"] == [1]


def test_json_keeps_integer_keys_of_evidence_as_strings() -> None:
    f = finding("called-several-times", NOTE, evidence={"modules": {0: 2}})
    assert json.loads(to_json(report(f)))["findings"][0]["evidence"] == {"modules": {"0": 2}}


@pytest.mark.parametrize(("steps", "want"), [
    ([3], "step 3"), ([0, 1, 2], "steps 0, 1, 2"),
    (list(range(12)), "steps 0, 1, 2, 3, 4 and 7 more")])
def test_steps_text(steps: list[int], want: str) -> None:
    assert steps_text(steps) == want


@pytest.mark.parametrize(("names", "want"), [
    (["", "a"], "(root), a"), (list("abcdefgh"), "a, b, c, d, e, f and 2 more")])
def test_names_text(names: list[str], want: str) -> None:
    assert names_text(names) == want


def test_text_shows_twelve_notes_and_counts_the_rest_json_keeps_all() -> None:
    """Notes that flood the report (issue 38): the first 12 printed, the rest counted; every
    warning printed whatever their number."""
    notes = [finding("frozen", NOTE, module=f"layers.{i}") for i in range(20)]
    warnings = [finding("no-grad", WARNING, module=f"w{i}") for i in range(15)]
    text = to_text(report(*notes, *warnings), "run.jsonl")
    lines = text.splitlines()
    assert "Notes (20)" in lines and "Warnings (15)" in lines
    assert sum(line.startswith("  [frozen]") for line in lines) == 12
    assert sum(line.startswith("  [no-grad]") for line in lines) == 15
    assert "  ... and 8 more notes (--json lists them all)" in lines
    assert lines[-1] == "15 problems (0 errors, 15 warnings), 20 notes"
    assert len(json.loads(to_json(report(*notes)))["findings"]) == 20


def test_twelve_notes_are_all_shown() -> None:
    text = to_text(report(*[finding("frozen", NOTE, module=f"m{i}") for i in range(12)]), "r")
    assert "more notes" not in text

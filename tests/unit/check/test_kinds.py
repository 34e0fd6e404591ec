"""A finding's kind is one of a few invariants, its cause what broke it: one table
(``findings.KINDS``) holds them, docs/findings.md lists the same, and every cause check makes
is in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hooktrace.check.findings import KIND_OF_CAUSE, KINDS, WARNING, Finding, FindingKind
from hooktrace.log.signals import kinds_of

ROOT = Path(__file__).resolve().parents[3]
CHECK = ROOT / "hooktrace" / "check"


def docs_table() -> dict[str, tuple[str, ...]]:
    """kind -> causes, as docs/findings.md's table of kinds lists them."""
    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    section = text.split("## The kinds and their causes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    return {kind.strip().strip("`"): tuple(re.findall(r"`([^`]+)`", causes))
            for kind, _, causes in rows}


def made_causes() -> set[str]:
    """The causes spelled where check makes a finding: ``Finding("word", ...)`` (or either
    word of a conditional), and the flow boundaries' table of causes."""
    words: set[str] = set(kinds_of(FindingKind))
    for path in CHECK.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                first = node.args[0] if node.args else None
                for n in ast.walk(first) if first is not None else ():
                    if isinstance(n, ast.Constant) and isinstance(n.value, str):
                        words.add(n.value)
    from hooktrace.check.causes import CAUSES
    return words | {kind for kind, *_ in CAUSES.values()}


def test_a_few_kinds_each_cause_in_one() -> None:
    assert len(KINDS) <= 15
    causes = [cause for group in KINDS.values() for cause in group]
    assert len(causes) == len(set(causes)) == len(KIND_OF_CAUSE)


def test_the_docs_list_every_kind_with_its_causes() -> None:
    assert {kind: sorted(causes) for kind, causes in docs_table().items()} == {
        kind: sorted(causes) for kind, causes in KINDS.items()}


def test_every_cause_check_makes_has_a_kind() -> None:
    assert made_causes() - set(KIND_OF_CAUSE) == set()
    assert "no-grad" in made_causes() and "vanishing" in made_causes()  # the scan sees them


def test_a_finding_names_its_kind_and_refuses_an_unknown_cause() -> None:
    found = Finding("grads-cleared", WARNING, "net", "fc", 3, "m")
    assert (found.kind, found.to_dict()["kind"], found.to_dict()["cause"]) == (
        "update", "update", "grads-cleared")
    with pytest.raises(ValueError, match="no kind"):
        Finding("made-up", WARNING, "net", "fc", 3, "m")

"""The reports of every checked-in log, word for word: ``check``'s text and JSON, ``diff``'s
JSON for each log against ``diff_a``, and ``render``'s DOT source of the default step, as they were
written to tests/unit/logs/reports/ when the consolidation (issue 37) began. A refactor that
changes one byte of what a user reads fails here; a change meant to alter a report writes the
files anew (``python tests/unit/check/test_reports_unchanged.py``) and the diff is reviewed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hooktrace.check.checklog import run_checks
from hooktrace.check.report import to_json, to_text
from hooktrace.diff import report as diffreport
from hooktrace.diff.compare import diff
from hooktrace.show.render import picture

HERE = Path(__file__).resolve()
LOGS = HERE.parents[1] / "logs"
REPORTS = LOGS / "reports"
NAMES = sorted(p.stem for p in LOGS.glob("*.jsonl"))


def reports(name: str) -> dict[str, Callable[[], str]]:
    """What each command says of ``LOGS/name.jsonl``, by the report's file name."""
    log = LOGS / f"{name}.jsonl"
    out: dict[str, Callable[[], str]] = {
        f"{name}.check.txt": lambda: to_text(run_checks(log), f"{name}.jsonl"),
        f"{name}.check.json": lambda: to_json(run_checks(log)),
    }
    if name != "crash":  # no step to draw
        out[f"{name}.dot"] = lambda: picture(log).source
    if name.startswith("diff_") and name != "diff_a":
        out[f"{name}.diff.json"] = lambda: diffreport.diff_json(
            diff(LOGS / "diff_a.jsonl", log))
    return out


def said(made: Callable[[], str]) -> str:
    """A report as written to its file: the folder of the logs, which a report may name, is
    ``LOGS`` (the same on every machine)."""
    return made().replace(str(LOGS), "LOGS") + "\n"


@pytest.mark.parametrize("name", NAMES)
def test_the_reports_are_unchanged(name: str) -> None:
    for file, made in reports(name).items():
        assert said(made) == (REPORTS / file).read_text(), file


if __name__ == "__main__":
    for name in NAMES:
        for file, made in reports(name).items():
            (REPORTS / file).write_text(said(made))
    sys.exit(0)

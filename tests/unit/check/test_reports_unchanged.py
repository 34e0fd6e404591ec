"""What each command says of every checked-in log: what ``check`` names (each finding's
severity, kind, cause, model, module and step, not its words: wording may change, detection may
not), ``diff``'s JSON for each log against ``diff_a`` and ``render``'s DOT source of the default
step, word for word (deterministic outputs, text goldens). They live in tests/unit/logs/reports/;
a change meant to alter them writes the files anew
(``python tests/unit/check/test_reports_unchanged.py``) and the diff is reviewed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hooktrace.diff import report as diffreport
from hooktrace.diff.compare import diff
from hooktrace.show.render import picture

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a script too
from tests.unit.check.test_blind_names_unchanged import said as named

HERE = Path(__file__).resolve()
LOGS = HERE.parents[1] / "logs"
REPORTS = LOGS / "reports"
NAMES = sorted(p.stem for p in LOGS.glob("*.jsonl"))


def reports(name: str) -> dict[str, Callable[[], str]]:
    """What each command says of ``LOGS/name.jsonl``, by the report's file name."""
    log = LOGS / f"{name}.jsonl"
    out: dict[str, Callable[[], str]] = {f"{name}.check.names": lambda: named(log)}
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


def test_every_log_names_something_or_is_healthy() -> None:
    """The names are not empty by accident: the logs of bugs name their bug."""
    for name in ("dead_relu", "detached", "frozen", "nan_layer", "unused", "crash"):
        assert (REPORTS / f"{name}.check.names").read_text().strip(), name


@pytest.mark.parametrize("name", NAMES)
def test_the_reports_are_unchanged(name: str) -> None:
    for file, made in reports(name).items():
        assert said(made) == (REPORTS / file).read_text(), file


if __name__ == "__main__":
    for old in [*REPORTS.glob("*.check.txt"), *REPORTS.glob("*.check.json")]:
        old.unlink()
    for name in NAMES:
        for file, made in reports(name).items():
            (REPORTS / file).write_text(said(made))
    sys.exit(0)

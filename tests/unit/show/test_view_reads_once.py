"""``hooktrace view`` reads each log once: one pass feeds check's collector, the heatmap's data
and the steps the call graphs draw (``steplog.FirstSteps``: the first steps by number, whatever
the order of the log, and no more); the logs of several ranks are read once each, by the walk
that finds where the ranks diverge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hooktrace.log.reader import LogReader
from hooktrace.show.steplog import FirstSteps, load_step
from hooktrace.show.view import view_page
from hooktrace.show.view.data import gather
from unit.show.handlog import Builder, chain


def _log(path: Path, steps: list[int], rank: int = 0, world_size: int = 1) -> Path:
    b = Builder()
    b.model(0, "net", "Net", {"fc1": "Linear", "fc2": "Linear"})
    for step in steps:
        chain(b, step, ["fc1", "fc2"], dataflow=True)
    return b.write(path, dataflow=True, rank=rank, world_size=world_size)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the log of each ``LogReader.scan``, as the scans begin."""
    begun: list[str] = []
    scan = LogReader.scan

    def counted(self: LogReader, *args: Any, **kwargs: Any) -> Iterator[Any]:
        begun.append(self.path.name)
        return scan(self, *args, **kwargs)

    monkeypatch.setattr(LogReader, "scan", counted)
    return begun


def test_first_steps_keeps_the_smallest_whatever_the_order() -> None:
    chooser = FirstSteps(3)
    for step in [5, 4, 9, 1, 7, 2, 8]:
        chooser.target(step, backward=False)
    assert sorted(chooser.kept) == [1, 2, 4]
    assert chooser.steps == {1, 2, 4, 5, 7, 8, 9}
    assert chooser.may_draw(3) and chooser.may_draw(4) and not chooser.may_draw(6)


def test_the_steps_kept_are_those_load_step_reads(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", [6, 2, 9, 0, 4, 1, 7])
    data = gather(LogReader(log), draw=3)
    kept = data.step_logs(None)
    assert sorted(kept) == [0, 1, 2]
    assert repr(kept) == repr({step: load_step(log, step) for step in [0, 1, 2]})


def test_the_page_reads_a_log_once(tmp_path: Path, scans: list[str]) -> None:
    log = _log(tmp_path / "log.jsonl", list(range(4)))
    view_page([log])
    assert scans == ["log.jsonl"]


def test_the_page_reads_each_rank_log_once(tmp_path: Path, scans: list[str]) -> None:
    logs = [_log(tmp_path / f"run.rank{r}.jsonl", list(range(4)), r, 2) for r in (0, 1)]
    view_page(logs)
    assert sorted(scans) == ["run.rank0.jsonl", "run.rank1.jsonl"]

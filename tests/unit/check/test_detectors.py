"""``check`` as a list of pure detectors over one summary of a log: the ``Collected`` a check
is given is left as it was, a log collected by another reader gives the report ``run_checks``
gives, a finding once made is not changed, and every detector and signal kind has one entry."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from hooktrace.check.checklog import check_collected, run_checks
from hooktrace.check.checks import DETECTORS, FINDINGS_OF_SIGNAL, SETTLE, summary_of
from hooktrace.check.collect import Collector, collect
from hooktrace.check.findings import WARNING, Finding
from hooktrace.check.report import to_json
from hooktrace.log.reader import LogReader

LOGS = Path(__file__).resolve().parents[1] / "logs"
NAMES = sorted(p.stem for p in LOGS.glob("*.jsonl"))


@pytest.mark.parametrize("name", NAMES)
def test_checking_leaves_the_collected_log_as_it_was(name: str) -> None:
    collected = collect(LOGS / f"{name}.jsonl")
    before = copy.deepcopy(collected)
    check_collected(collected)
    assert collected == before


@pytest.mark.parametrize("name", ["crash", "frozen", "gan", "nan_layer"])
def test_a_log_collected_by_another_reader_reports_as_run_checks(name: str) -> None:
    path = LOGS / f"{name}.jsonl"
    reader = LogReader(path)
    collector = Collector(reader)
    for item in reader.scan():
        collector.take(item)
    assert to_json(check_collected(collector.finish(), path=path)) == to_json(run_checks(path))


def test_a_finding_is_not_changed_once_made() -> None:
    f = Finding("no-grad", WARNING, "model", "fc", 0, "fc got no gradient")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.message = "changed"  # type: ignore[misc]


def test_each_detector_and_each_signal_kind_has_one_entry() -> None:
    names = [name for name, _ in DETECTORS]
    assert len(SETTLE) == len({name for name, _ in SETTLE})
    assert len(names) == len(set(names))
    assert "optimizers" in FINDINGS_OF_SIGNAL and "loss-share" not in FINDINGS_OF_SIGNAL


def test_a_backward_that_never_ended_is_settled_on_a_copy() -> None:
    collected = collect(LOGS / "detached.jsonl")
    step = min(collected.backward_steps)
    collected = dataclasses.replace(collected, unfinished=(step, next(iter(collected.modules))))
    before = copy.deepcopy(collected)
    check_collected(collected)
    assert collected == before
    assert summary_of(collected).c.backward_steps == collected.backward_steps - {step}

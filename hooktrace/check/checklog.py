"""``hooktrace check``'s reading side: read a run's logs, run the checks, one ``Report``.

One log is collected (``collect``), summarized once (``summary.summary_of``) and judged
(``checks.judge``); ``check_collected`` does that for a log another reader already collected
(``collect.Collector`` takes the items of its ``LogReader.scan``). The logs of several ranks
are walked together to find where the ranks' execution diverges (``ranks.first_divergence``),
and that walk feeds each rank's collector (each log is read once); each rank is checked, and the
findings merged where the ranks agree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hooktrace.check.checks import judge, ordered, summary_of
from hooktrace.check.collect import Collector, collect
from hooktrace.check.collected import Collected
from hooktrace.check.findings import (
    ERROR,
    Finding,
    FindingKind,
    Report,
    Thresholds,
)
from hooktrace.check.models import model_facts
from hooktrace.check.ranks import first_divergence
from hooktrace.log import schema
from hooktrace.log.align import Feed
from hooktrace.log.decoder import Rows
from hooktrace.log.discovery import open_ranks
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.log.words import fqn_text, plural, ranges
from hooktrace.log.writer import capture_dir


def run_checks(path: str | os.PathLike[str], step: int | None = None,
               thresholds: Thresholds | None = None) -> Report:
    """The findings of one log (of one rank); ``step``: that step only."""
    return check_collected(collect(path, step), step, thresholds, path)


def check_collected(collected: Collected, step: int | None = None,
                    thresholds: Thresholds | None = None,
                    path: str | os.PathLike[str] | None = None) -> Report:
    """The findings of one log already collected (``collect.collect``, or a ``Collector`` fed
    by another reader's scan, with the same ``step``): ``collected`` is left as it was.
    ``path``: the log's path as the user gave it (default: as collected)."""
    path = collected.log if path is None else path
    if step is not None and step not in collected.steps_seen | collected.backward_steps:
        seen = sorted(collected.steps_seen | collected.backward_steps)
        have = ranges(seen) if seen else "none"
        raise HooktraceError(f"no step {step} in {path}; its steps: {have}")
    summary = summary_of(collected, thresholds)
    findings = judge(summary)
    if step is not None:  # signals are kept whole (what holds, as the optimizers of a model):
        # what they say happened after the step asked for is no finding of it
        findings = [f for f in findings if f.step is None or f.step <= step]
    c = summary.c  # settled: an unfinished backward's step is not counted
    events = c.end.events if c.end else c.events  # without an end record: what the log holds
    steps = 1 if step is not None else c.end.steps if c.end else len(c.backward_steps)
    captured = None
    if c.end is not None and c.end.captured:
        captured = f"{capture_dir(Path(path))} ({plural(c.end.captured, 'file')})"
    return Report(findings, c.warnings, steps, events, captured, model_facts(c))


_PARTED = {"ran": "modules", "shapes": "shapes", "dtypes": "dtypes", "steps": "steps"}


def check_ranks(readers: Sequence[LogReader], feeds: Sequence[Feed] | None = None
                ) -> list[Finding]:
    """The first step and module where the ranks' execution diverges (``feeds``: see
    ``ranks.first_divergence``)."""
    found = first_divergence(readers, feeds)
    if found is None:
        return []
    what = "; ".join(f"rank {rank}: {desc}" for rank, desc in found.ranks.items())
    where = f", from {fqn_text(found.module)}" if found.model else ""
    return [Finding(
        FindingKind.RANK_DIVERGENCE, ERROR, found.model, found.module, found.step,
        f"the ranks ran different {_PARTED[found.kind]} at step {found.step}{where} ({what})",
        {"position": found.position, "ranks": {str(r): d for r, d in found.ranks.items()}},
        "DDP hangs, or fails with 'unused parameters', when ranks run different modules: look "
        "for branches on data (a loss value, a batch's content) and uneven last batches",
        sorted(found.ranks))]


def run_checks_ranks(paths: Sequence[str | os.PathLike[str]], step: int | None = None,
                     thresholds: Thresholds | None = None) -> Report:
    """Check one log, or the logs of several ranks of one run: each rank's findings (merged
    where ranks agree, marked where only some ranks have them) and where the ranks diverge."""
    readers = open_ranks(paths)
    if len(readers) == 1:
        return run_checks(readers[0].path, step, thresholds)
    return check_readers(readers, step, thresholds)


def check_readers(readers: Sequence[LogReader], step: int | None = None,
                  thresholds: Thresholds | None = None,
                  feeds: Sequence[Feed | None] | None = None) -> Report:
    """``run_checks_ranks`` of the logs of several ranks, open; ``feeds``, one per log (or
    None), are given every item of their log too (the view page's ``Gatherer``)."""
    # each log read once: the walk that finds where the ranks diverge feeds each rank's collector
    collectors = [Collector(reader, step) for reader in readers]
    diverged = check_ranks(readers, [c.take if f is None else _both(c.take, f) for c, f in zip(
        collectors, feeds or [None] * len(readers), strict=True)])
    merged: dict[tuple[str, str, str, int | None], Finding] = {}
    reports = []
    for reader, collector in zip(readers, collectors, strict=True):
        report = check_collected(collector.finish(), step, thresholds, reader.path)
        reports.append(report)
        for f in report.findings:
            known = merged.get(key := (f.cause, f.model, f.module, f.step), f)
            merged[key] = replace(known, ranks=[*(known.ranks or []), reader.header.rank])
    every = sorted(r.header.rank for r in readers)
    for key, f in merged.items():
        if f.ranks == every:
            merged[key] = replace(f, ranks=None)  # on every rank: nothing rank-local about it
    findings = ordered([*diverged, *merged.values()])
    return Report(findings, [w for r in reports for w in r.warnings],
                  max(r.steps for r in reports), sum(r.events for r in reports),
                  "; ".join(r.captured for r in reports if r.captured) or None,
                  reports[0].models)  # the models of the first rank: the ranks run one script


def _both(first: Feed, second: Feed) -> Feed:
    def feed(item: Rows | schema.Record) -> None:
        first(item)
        second(item)
    return feed

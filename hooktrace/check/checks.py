"""Gradient-flow diagnostics: one rank's collected log in, findings out. Pure: no files, no
printing, no torch, and the ``Collected`` given is left as it was.

``summary.summary_of`` settles a collected log and analyses its gradient flow once; the
detectors (``detectors.DETECTORS``) turn that summary into findings; ``judge`` runs them and
settles what they found (one finding explaining another, where to look, one order). Reading
the logs is ``checklog``'s job; printing them, ``report``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check import notes, oplines, units
from hooktrace.check.detectors import detect
from hooktrace.check.findings import SEVERITY_ORDER, Finding, Thresholds, after_causes
from hooktrace.check.lossterms import absorb
from hooktrace.check.scaling import after_scaling
from hooktrace.check.sources import with_sources
from hooktrace.check.summary import LogSummary, summary_of

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected


def check_all(c: Collected, thresholds: Thresholds) -> list[Finding]:
    """Every finding of one rank's collected log, most severe first, then in step and forward
    order."""
    return judge(summary_of(c, thresholds))


def judge(s: LogSummary) -> list[Finding]:
    """Every finding of a log's summary, most severe first, then in step and forward order."""
    c = s.c
    findings = detect(s)
    findings = absorb(c, findings)  # a gradient cut in the loss, not inside a forward
    findings = units.zero_before_moving(c, s.flowed, findings)
    findings = after_scaling(findings)
    findings = with_sources(c, findings)
    findings = oplines.with_op_lines(findings, c, s.flowed)
    findings = notes.settle(c, findings)
    order = {m.fqn: m.first_seq or 0 for m in c.modules.values()}
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.step if f.step is not None else -1,
                                 order.get(f.module, 0), f.cause))
    return after_causes(findings)

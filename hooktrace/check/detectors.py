"""The detectors ``check`` runs, in one list: each a pure function from a log's summary
(``summary.LogSummary``) to findings, in the module of its idea. Their order is the order of
findings that tie in the report's sort (severity, step, forward order, kind)."""

from __future__ import annotations

from collections.abc import Callable

from hooktrace.check import causes, copies
from hooktrace.check.callnotes import check_info
from hooktrace.check.crash import check_crash
from hooktrace.check.custom import check_custom
from hooktrace.check.findings import Finding
from hooktrace.check.loop import check_loop
from hooktrace.check.losses import check_losses
from hooktrace.check.lossterms import check_loss_terms
from hooktrace.check.magnitudes import check_magnitudes
from hooktrace.check.nonfinite import check_nonfinite
from hooktrace.check.probed import check_probed
from hooktrace.check.reached import check_lost_gradient, check_no_grad
from hooktrace.check.registered import check_loose
from hooktrace.check.relations import check_relations
from hooktrace.check.scaling import check_scaling
from hooktrace.check.shared import check_shared_targets
from hooktrace.check.signals import check_signals
from hooktrace.check.summary import LogSummary
from hooktrace.check.unseen import check_unseen
from hooktrace.check.unused import check_unused

Detector = Callable[[LogSummary], list[Finding]]

DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("crash", lambda s: check_crash(s.c)),
    ("unseen", lambda s: check_unseen(s.c)),
    ("non-finite", lambda s: check_nonfinite(s.c)),
    ("signals", lambda s: check_signals(s.c)),  # each signal a finding answers: one table
    ("training loop", lambda s: check_loop(s.c)),
    ("custom functions and hooks", lambda s: check_custom(s.c)),
    ("probed", lambda s: check_probed(s.c)),
    ("gradient flow", lambda s: causes.findings(s.flowed, s.c.modules, s.c.models)),
    ("no gradient", lambda s: check_no_grad(s.c, s.explained | s.turns)),
    ("lost gradient", lambda s: check_lost_gradient(s.c)),
    ("magnitudes", lambda s: check_magnitudes(s.c, s.thresholds, s.explained)),
    ("unused", lambda s: check_unused(s.c)),
    ("loose tensors", lambda s: check_loose(s.c)),
    ("losses", lambda s: check_losses(s.c)),
    ("loss terms", lambda s: check_loss_terms(s.c)),
    ("how modules ran", lambda s: check_info(s.c, s.evaluation)),
    ("loss scaling", lambda s: check_scaling(s.c)),
    ("shared targets", lambda s: check_shared_targets(s.c)),
    ("model relations", lambda s: check_relations(s.c)),
    ("evaluation copies", lambda s: copies.copies_notes(s.c, s.evaluation)),
)


def detect(s: LogSummary) -> list[Finding]:
    """Every detector's findings, in the list's order."""
    return [f for _, detector in DETECTORS for f in detector(s)]

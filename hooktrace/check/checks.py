"""Gradient-flow diagnostics: one rank's collected log in, findings out. Pure: no files, no
printing, no torch, and the ``Collected`` given is left as it was.

``summary.summary_of`` settles a collected log and analyses its gradient flow once; the
detectors (``DETECTORS``, one ordered list of pure functions) turn that summary into findings;
one settling pass (``SETTLE``) goes over them by cause: which cause explains, takes in or
follows from which, one note for a cause repeating over many modules, where to look, one order.
Reading the logs is ``checklog``'s job; printing them, ``report``'s.
"""

from __future__ import annotations

from collections.abc import Callable

from hooktrace.check import causes, oplines, trainable
from hooktrace.check.crash import check_crash, check_unseen
from hooktrace.check.findings import NOTE, SEVERITY_ORDER, Finding, FindingKind
from hooktrace.check.grouped import copies as copies_of
from hooktrace.check.grouped import copies_notes, inside, patterns
from hooktrace.check.loop import check_custom, check_loop
from hooktrace.check.losses import check_losses, unbounded
from hooktrace.check.lossterms import absorb, check_loss_terms
from hooktrace.check.magnitudes import check_magnitudes
from hooktrace.check.nonfinite import check_nonfinite
from hooktrace.check.probed import check_probed
from hooktrace.check.reached import check_loose, check_lost_gradient, check_no_grad
from hooktrace.check.relations import check_relations, check_shared_targets
from hooktrace.check.signals import check_signals
from hooktrace.check.sources import with_sources
from hooktrace.check.summary import LogSummary
from hooktrace.check.unused import check_info, check_unused, losses_dropped
from hooktrace.check.updates import after_scaling, check_scaling
from hooktrace.log.words import plural

Detector = Callable[[LogSummary], list[Finding]]
Settler = Callable[[LogSummary, list[Finding]], list[Finding]]

# Their order is the order of findings that tie in the report's sort (severity, step, forward
# order, cause).
DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("crash", lambda s: check_crash(s.c)),
    ("unseen", lambda s: check_unseen(s.c)),
    ("non-finite", lambda s: check_nonfinite(s.c)),
    ("signals", lambda s: check_signals(s.c)),  # each signal a finding answers: one table
    ("training loop", lambda s: check_loop(s.c)),
    ("custom functions and hooks", lambda s: check_custom(s.c)),
    ("probed", lambda s: check_probed(s.c)),
    ("gradient flow", lambda s: causes.findings(s.flowed, s.c)),
    ("no gradient", lambda s: check_no_grad(s.c, s.explained | s.turns)),
    ("lost gradient", lambda s: check_lost_gradient(s.c)),
    ("magnitudes", lambda s: check_magnitudes(s.c, s.thresholds, s.explained)),
    ("unused", lambda s: check_unused(s.c)),
    ("loose tensors", lambda s: check_loose(s.c)),
    ("losses", lambda s: check_losses(s.c)),
    ("losses without a floor", lambda s: unbounded(s.c)),
    ("loss terms", lambda s: check_loss_terms(s.c)),
    ("losses let go", lambda s: losses_dropped(s.c)),
    ("how modules ran", lambda s: check_info(s.c, s.evaluation)),
    ("loss scaling", lambda s: check_scaling(s.c)),
    ("shared targets", lambda s: check_shared_targets(s.c)),
    ("model relations", lambda s: check_relations(s.c)),
    ("evaluation copies", lambda s: copies_notes(s.c, s.evaluation)),
)

# the notes that come one per module of a cause: a frozen BatchNorm in train mode, a layer
# initialised to zero (which passes nothing back before its first update)
REPEATING = (FindingKind.FROZEN_BN_TRAINING, FindingKind.ZERO_GRADIENT)


def _copies_bn(s: LogSummary, findings: list[Finding]) -> list[Finding]:
    """A frozen copy of a trained module (a BYOL target, an EMA copy) runs in train mode on
    purpose, its statistics following the batches as the online network's do: no ``.eval()``
    advice for its BatchNorms."""
    if not any(f.cause == FindingKind.FROZEN_BN_TRAINING for f in findings):
        return findings
    models = {s.c.model_name(i): i for i in s.c.models}
    tops = list(copies_of(s.c))
    return [f for f in findings if f.cause != FindingKind.FROZEN_BN_TRAINING
            or not inside((models.get(f.model, -1), f.module), tops)]


def _repeating(s: LogSummary, findings: list[Finding]) -> list[Finding]:
    """Each ``REPEATING`` note that repeats over several modules of a model as one note
    listing them."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        if f.severity == NOTE and f.cause in REPEATING:
            groups.setdefault((f.cause, f.model, f.hint), []).append(f)
    out = []
    for f in findings:
        group = groups.get((f.cause, f.model, f.hint)) if f.severity == NOTE else None
        if group is None or len(group) == 1:
            out.append(f)
        elif group[0] is f:
            first, rest = group[0], group[1:]
            out.append(Finding(
                first.cause, NOTE, first.model, first.module, first.step,
                f"{first.message}; the same at {plural(len(rest), 'more module')} (in all: "
                f"{patterns(g.module for g in group)})",
                {**first.evidence, "modules": [g.module for g in group]}, first.hint,
                source=first.source))
    return out


def ordered(findings: list[Finding], order: dict[str, int] | None = None) -> list[Finding]:
    """Most severe first, then in step and forward order (``order``: a module's place), then
    by cause; a finding that follows from another's cause just after it."""
    return after_causes(sorted(findings, key=lambda f: (
        SEVERITY_ORDER[f.severity], f.step if f.step is not None else -1,
        (order or {}).get(f.module, 0), f.cause)))


def after_causes(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each one that follows from another (its evidence's ``follows``: the
    cause of that other, in the same model) moved to just after the other: the cause reads
    first, whatever the sort put between them."""
    out = list(findings)
    for f in findings:
        follows = f.evidence.get("follows")
        if follows and any(o.cause == follows and o.model == f.model for o in out):
            out = [o for o in out if o is not f]
            at = max(i for i, o in enumerate(out) if o.cause == follows and o.model == f.model)
            out.insert(at + 1, f)
    return out


# One settling pass, in order: each rule takes the findings of some causes and settles them
# by the others (explained, taken in, following from), then where to look, then one order.
SETTLE: tuple[tuple[str, Settler], ...] = (
    # a cut in the loss takes the no-grads it explains; an empty read, the zeros
    ("a cut in the loss, an empty read", lambda s, f: absorb(s.c, f)),
    # zero weights in the passes before their first step with lr > 0: a note
    ("zero weights not moved yet", lambda s, f: trainable.zero_before_moving(s.c, s.flowed, f)),
    # what a scaled step makes (NaN, growing gradients) follows from it
    ("what a scaled step makes", lambda s, f: after_scaling(f)),
    ("the BatchNorms of frozen copies", _copies_bn),
    ("where to look: the forward", lambda s, f: with_sources(s.c, f)),
    ("where to look: the op", lambda s, f: oplines.with_op_lines(f, s.c, s.flowed)),
    ("one note per repeating cause", _repeating),
    ("one order", lambda s, f: ordered(f, {m.fqn: m.first_seq or 0
                                            for m in s.c.modules.values()})),
)


def judge(s: LogSummary) -> list[Finding]:
    """Every finding of a log's summary, settled, most severe first, then in step and forward
    order."""
    findings = [f for _, detector in DETECTORS for f in detector(s)]
    for _, rule in SETTLE:
        findings = rule(s, findings)
    return findings

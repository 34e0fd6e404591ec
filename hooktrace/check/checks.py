"""Gradient-flow diagnostics: one rank's collected log in, findings out. Pure: no files, no
printing, no torch, and the ``Collected`` given is left as it was.

``summary_of`` settles a collected log and analyses its gradient flow once; the detectors
(``DETECTORS``, one ordered list of pure functions) turn that summary into findings; one
settling pass (``SETTLE``) goes over them by cause: which cause explains, takes in or follows
from which, one note for a cause repeating over many modules, where to look, one order.
Reading the logs is ``checklog``'s job; printing them, ``report``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hooktrace.check import (
    causes,
    flow,
    holds,
    loop,
    losses,
    lossterms,
    oplines,
    trainable,
    updates,
)
from hooktrace.check.crash import check_crash, check_unseen
from hooktrace.check.findings import NOTE, SEVERITY_ORDER, Finding, FindingKind, Thresholds
from hooktrace.check.grouped import copies as copies_of
from hooktrace.check.grouped import copies_notes, evaluation_copies, inside, patterns
from hooktrace.check.magnitudes import check_magnitudes, start, start_orders
from hooktrace.check.nonfinite import check_nonfinite
from hooktrace.check.probed import check_probed
from hooktrace.check.reached import (
    check_info,
    check_loose,
    check_lost_gradient,
    check_no_grad,
    check_unused,
    losses_dropped,
)
from hooktrace.check.relations import check_relations, check_shared_targets
from hooktrace.check.stepexplained import optimizer_steps, step_sample
from hooktrace.check.trainable import drop_frozen, frozen_from_start, frozen_since
from hooktrace.log.names import ancestors
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.boundary import GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn
    from hooktrace.log.schema import Signal


@dataclass(frozen=True)
class LogSummary:
    """One rank's collected log as the detectors read it."""

    # the collected log, settled: an unfinished backward's step is not judged (a backward that
    # raised starves every module before it), and a module frozen inside the first forward is
    # frozen from the start; what ``check`` counts (steps, models) is counted on it
    c: Collected
    thresholds: Thresholds
    flowed: GradientFlow  # the gradient flow's boundaries, without those the run explains
    turns: set[ModelFqn]  # trained in turns (``trainable.trained_in_turns``)
    evaluation: set[ModelFqn]  # copies no optimizer that stepped holds (``grouped``)
    explained: set[ModelFqn]  # small or missing gradients that a boundary or a freeze explains
    starts: dict[ModelFqn, int]  # where each module starts in forward order (``start_orders``)
    copies: dict[ModelFqn, ModelFqn]  # frozen copies of trained modules (``grouped.copies``)
    model_of: dict[str, int]  # each model's index by the name findings give it


def summary_of(collected: Collected, thresholds: Thresholds | None = None) -> LogSummary:
    """``collected`` settled and analysed for the detectors."""
    thresholds = thresholds or Thresholds()
    c = settled(collected)
    unjudged = c.zero_loss_steps() | ({c.unfinished[0]} if c.unfinished else set())
    flowed = flow.analyse([call for call in c.calls if call.step not in unjudged], c.modules,
                          thresholds)
    drop_frozen(c, flowed)
    turns = trainable.trained_in_turns(c)
    flowed.drop_victims(turns, trainable.MISSED)
    evaluation = evaluation_copies(c)
    flowed.drop_victims(evaluation)
    starts = start_orders(c)
    explained = _explained(c, flowed, starts) | set(frozen_since(c)) | evaluation
    return LogSummary(c, thresholds, flowed, turns, evaluation, explained, starts, copies_of(c),
                      {c.model_name(i): i for i in c.models})


def settled(c: Collected) -> Collected:
    """A copy of ``c`` as the checks judge it: an unfinished backward's step is not a step
    with a backward, and the modules frozen inside the first forward have no trainable
    parameters."""
    steps = set(c.backward_steps)
    if c.unfinished is not None:
        steps.discard(c.unfinished[0])
    frozen = frozen_from_start(c)
    modules = {key: replace(m, trainable=0) if key in frozen else m
               for key, m in c.modules.items()}
    return replace(c, backward_steps=steps, modules=modules)


def _explained(c: Collected, found: GradientFlow, starts: dict[ModelFqn, int]
               ) -> set[ModelFqn]:
    """The modules whose small or missing gradients a boundary explains: those it starves, the
    never-called ones inside them (MultiheadAttention's out_proj, whose parameters its parent
    uses), and the modules whose own parameters are used before it in forward (a ViT's class
    token, on its root)."""
    starved = found.victims
    before = set()
    for b in found.boundaries.values():
        limit = start(starts, b.key)
        before |= {key for key, m in c.modules.items() if key[0] == b.key[0] and m.trainable
                   and start(starts, key) < limit}
    return starved | before | {key for key, m in c.modules.items() if not m.calls and any(
        (key[0], name) in starved for name in ancestors(key[1]))}


# Signals into findings, in one table: each ``signal`` record kind that a finding of its own
# answers, with the function that turns one such signal into findings, run in the log's order.
# The signals that only add up with others (``hooks-growing``, ``loss-share``, ``loss-scaled``)
# and those that only shape another finding (``nonfinite-inputs``, ...) are read where their
# findings are made. "optimizers": the last such signal of each model only.
FINDINGS_OF_SIGNAL: dict[str, Callable[[Collected, Signal], list[Finding]]] = {
    SignalKind.EVAL_BACKWARD: trainable.eval_backward,
    SignalKind.OPTIMIZERS: holds.not_held,
    SignalKind.GRADS_CARRIED_OVER: holds.at_step,
    SignalKind.GRADS_CLEARED: holds.at_step,
    SignalKind.GRADS_ZEROED: holds.at_step,
    SignalKind.PARAMS_RECREATED: holds.params_recreated,
    SignalKind.BACKWARD_HOOK: loop.backward_hook_only,
    SignalKind.FROZEN_BN_TRAINING: trainable.frozen_bn_training,
    SignalKind.HALF_UPDATES: updates.updates_rounded,
    SignalKind.OPTIMIZER_LRS: updates.optimizer_lrs,
    SignalKind.STEP_SAMPLE: step_sample,
    SignalKind.OPTIMIZER_STEPS: optimizer_steps,
    SignalKind.FUNCTION_BACKWARD: loop.function_backward,
    SignalKind.SCALED_STEP: updates.scaled_step,
    SignalKind.SCALED_CLIP: updates.scaled_clip,
    SignalKind.LOSS_TERM_CUT: lossterms.term_cut,
    SignalKind.LOSS_TARGET_GRAD: lossterms.target_grad,
    SignalKind.SHARED_STORAGE: holds.shared_storage,
    SignalKind.LOSS_VALUES: losses.diverged,
    SignalKind.PARAMS_UNMOVED: updates.params_unmoved,
}


def check_signals(c: Collected) -> list[Finding]:
    """The findings of each signal the table answers, in the log's order."""
    last = {s.model: s for s in c.signals if s.kind == SignalKind.OPTIMIZERS}
    return [f for s in c.signals if s.kind in FINDINGS_OF_SIGNAL
            and (s.kind != SignalKind.OPTIMIZERS or last[s.model] is s)
            for f in FINDINGS_OF_SIGNAL[s.kind](c, s)]


Detector = Callable[[LogSummary], list[Finding]]
Settler = Callable[[LogSummary, list[Finding]], list[Finding]]

# Their order is the order of findings that tie in the report's sort (severity, step, forward
# order, cause).
DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("crash", lambda s: check_crash(s.c)),
    ("unseen", lambda s: check_unseen(s.c)),
    ("non-finite", lambda s: check_nonfinite(s.c)),
    ("signals", lambda s: check_signals(s.c)),  # each signal a finding answers: one table
    ("training loop", lambda s: loop.check_loop(s.c)),
    ("custom functions and hooks", lambda s: loop.check_custom(s.c)),
    ("probed", lambda s: check_probed(s.c)),
    ("gradient flow", lambda s: causes.findings(s.flowed, s.c)),
    ("no gradient", lambda s: check_no_grad(s.c, s.copies, s.explained | s.turns)),
    ("lost gradient", lambda s: check_lost_gradient(s.c)),
    ("magnitudes", lambda s: check_magnitudes(s.c, s.thresholds, s.starts, s.explained)),
    ("unused", lambda s: check_unused(s.c)),
    ("loose tensors", lambda s: check_loose(s.c)),
    ("losses", lambda s: losses.check_losses(s.c)),
    ("losses without a floor", lambda s: losses.unbounded(s.c)),
    ("loss terms", lambda s: lossterms.check_loss_terms(s.c)),
    ("losses let go", lambda s: losses_dropped(s.c)),
    ("how modules ran", lambda s: check_info(s.c, s.evaluation)),
    ("loss scaling", lambda s: updates.check_scaling(s.c)),
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
    return [f for f in findings if f.cause != FindingKind.FROZEN_BN_TRAINING
            or not inside((s.model_of.get(f.model, -1), f.module), s.copies)]


def _repeating(s: LogSummary, findings: list[Finding]) -> list[Finding]:
    """Each ``REPEATING`` note that repeats over several modules of a model as one note."""
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
            out.append(replace(
                f, message=f"{f.message}; the same at {plural(len(group) - 1, 'more module')} "
                f"(in all: {patterns(g.module for g in group)})",
                evidence={**f.evidence, "modules": [g.module for g in group]}))
    return out


def _with_sources(s: LogSummary, findings: list[Finding]) -> list[Finding]:
    """Each finding with its module's class's forward as the log recorded it, or, for torch's
    own classes (none recorded), the forward of the nearest module around it that has one (the
    user's code that calls it); not a loss's, outside every forward: its own line says where."""
    c = s.c
    if not c.sources:
        return findings
    out = []
    for f in findings:
        if f.cause not in (FindingKind.LOSS_TERM_CUT, FindingKind.LOSS_TARGET_GRAD):
            found = (c.modules.get((s.model_of.get(f.model, -1), name))
                     for name in [f.module, *reversed(ancestors(f.module))])
            m = next((m for m in found if m is not None and m.cls in c.sources), None)
            if m is not None:
                f = replace(f, source=f"{c.sources[m.cls]} ({m.cls}.forward)")
        out.append(f)
    return out


def ordered(findings: list[Finding], order: dict[str, int] | None = None) -> list[Finding]:
    """Most severe first, then in step and forward order (``order``: a module's place), then
    by cause; a finding that follows from another's cause just after it."""
    return after_causes(sorted(findings, key=lambda f: (
        SEVERITY_ORDER[f.severity], f.step if f.step is not None else -1,
        (order or {}).get(f.module, 0), f.cause)))


def after_causes(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each one that follows from another (its evidence's ``follows``: the
    cause of that other, in the same model) moved to just after the other."""
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
    ("a cut in the loss, an empty read", lambda s, f: lossterms.absorb(s.c, f)),
    # zero weights in the passes before their first step with lr > 0: a note
    ("zero weights not moved yet", lambda s, f: trainable.zero_before_moving(s.c, s.flowed, f)),
    # what a scaled step makes (NaN, growing gradients) follows from it
    ("what a scaled step makes", lambda s, f: updates.after_scaling(f)),
    ("the BatchNorms of frozen copies", _copies_bn),
    ("where to look: the forward", _with_sources),
    ("where to look: the op", lambda s, f: oplines.with_op_lines(f, s.c, s.flowed, s.model_of)),
    ("one note per repeating cause", _repeating),
    ("one order", lambda s, f: ordered(f, {m.fqn: m.first_seq or 0
                                            for m in s.c.modules.values()})),
)


def judge(s: LogSummary) -> list[Finding]:
    """Every finding of a log's summary, settled and in order."""
    findings = [f for _, detector in DETECTORS for f in detector(s)]
    for _, rule in SETTLE:
        findings = rule(s, findings)
    return findings

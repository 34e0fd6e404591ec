"""Signals into findings, in one table: each ``signal`` record kind that a finding of its own
answers, with the function that turns one such signal into findings (none where it is
harmless), run in the log's order. The signals that only add up with others (``hooks-growing``,
``loss-share``, ``loss-scaled``: ``loop``, ``lossterms``, ``updates``) and those that only
shape another finding (``nonfinite-inputs``, ``trainable-changed``, ...)
are read where their findings are made. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hooktrace.check import holds, loop, losses, lossterms, trainable, updates
from hooktrace.check.findings import Finding
from hooktrace.check.stepexplained import optimizer_steps, step_sample
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

SignalFindings = Callable[["Collected", "Signal"], list[Finding]]

# signal kind -> its findings; "optimizers": the last such signal of each model only
FINDINGS_OF_SIGNAL: dict[str, SignalFindings] = {
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
    out: list[Finding] = []
    last = {s.model: s for s in c.signals if s.kind == SignalKind.OPTIMIZERS}  # all optimizers seen
    for s in c.signals:
        if s.kind == SignalKind.OPTIMIZERS and last[s.model] is not s:
            continue
        make = FINDINGS_OF_SIGNAL.get(s.kind)
        if make is not None:
            out += make(c, s)
    return out

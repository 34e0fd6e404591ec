"""Signals into findings, in one table: each ``signal`` record kind that a finding of its own
answers, with the function that turns one such signal into findings (none where it is
harmless), run in the log's order. The signals that only add up with others (``hooks-growing``,
``loss-share``, ``loss-scaled``: ``custom``, ``lossterms``, ``scaling``) and those that only
shape another finding (``nonfinite-inputs``, ``trainable-changed``, ``optimizer-steps``, ...)
are read where their findings are made. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hooktrace.check import holds, loop, lossterms, scaling, updates
from hooktrace.check.custom import function_backward
from hooktrace.check.findings import Finding
from hooktrace.check.modes import eval_backward
from hooktrace.check.stepexplained import step_unexplained

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

SignalFindings = Callable[["Collected", "Signal"], list[Finding]]

# signal kind -> its findings; "optimizers": the last such signal of each model only
FINDINGS_OF_SIGNAL: dict[str, SignalFindings] = {
    "eval-backward": eval_backward,
    "optimizers": loop.not_held,
    "grads-carried-over": loop.carried_over,
    "grads-cleared": loop.grads_cleared,
    "grads-zeroed": loop.grads_zeroed,
    "params-recreated": loop.params_recreated,
    "backward-hook": loop.backward_hook_only,
    "frozen-bn-training": loop.frozen_bn_training,
    "weights-unchanged": updates.weights_unchanged,
    "updates-rounded": updates.updates_rounded,
    "lr-collapsed": updates.lr_collapsed,
    "weight-decay": updates.weight_decay,
    "step-unexplained": step_unexplained,
    "function-backward": function_backward,
    "scaled-step": scaling.scaled_step,
    "scaled-clip": scaling.scaled_clip,
    "loss-term-cut": lossterms.term_cut,
    "loss-target-grad": lossterms.target_grad,
    "shared-storage": holds.shared_storage,
    "stepped-twice": holds.stepped_twice,
}


def check_signals(c: Collected) -> list[Finding]:
    """The findings of each signal the table answers, in the log's order."""
    out: list[Finding] = []
    last = {s.model: s for s in c.signals if s.kind == "optimizers"}  # all optimizers seen
    for s in c.signals:
        if s.kind == "optimizers" and last[s.model] is not s:
            continue
        make = FINDINGS_OF_SIGNAL.get(s.kind)
        if make is not None:
            out += make(c, s)
    return out

"""What the detectors read: one rank's collected log, settled for judging, with the gradient
flow's boundaries and the modules whose findings another finding explains. Made once per log
(``summary_of``); ``summary_of`` leaves the ``Collected`` it is given as it was."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hooktrace.check import flow
from hooktrace.check.findings import Thresholds
from hooktrace.check.grouped import evaluation_copies
from hooktrace.check.magnitudes import start, start_orders
from hooktrace.check.trainable import (
    MISSED,
    drop_frozen,
    frozen_from_start,
    frozen_since,
    trained_in_turns,
)
from hooktrace.log.names import ancestors

if TYPE_CHECKING:
    from hooktrace.check.boundary import GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


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


def summary_of(collected: Collected, thresholds: Thresholds | None = None) -> LogSummary:
    """``collected`` settled and analysed for the detectors (``checks.DETECTORS``)."""
    thresholds = thresholds or Thresholds()
    c = settled(collected)
    unjudged = c.zero_loss_steps() | ({c.unfinished[0]} if c.unfinished else set())
    flowed = flow.analyse([call for call in c.calls if call.step not in unjudged], c.modules,
                          thresholds)
    drop_frozen(c, flowed)
    turns = trained_in_turns(c)
    flowed.drop_victims(turns, MISSED)
    evaluation = evaluation_copies(c)
    flowed.drop_victims(evaluation)
    explained = _explained(c, flowed) | set(frozen_since(c)) | evaluation
    return LogSummary(c, thresholds, flowed, turns, evaluation, explained)


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


def _explained(c: Collected, found: GradientFlow) -> set[ModelFqn]:
    """The modules whose small or missing gradients a boundary explains: those it starves, the
    never-called ones inside them (MultiheadAttention's out_proj, whose parameters its parent
    uses), and the modules whose own parameters are used before it in forward (a ViT's class
    token, on its root)."""
    starved = found.victims
    starts = start_orders(c)
    before = set()
    for b in found.boundaries.values():
        limit = start(starts, b.key)
        before |= {key for key, m in c.modules.items() if key[0] == b.key[0] and m.trainable
                   and start(starts, key) < limit}
    return starved | before | {key for key, m in c.modules.items() if not m.calls and any(
        (key[0], name) in starved for name in ancestors(key[1]))}

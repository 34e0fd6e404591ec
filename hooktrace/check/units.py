"""Judging in the units training uses: optimizer steps and turns, not backward passes.

* **Optimizer steps** (the ``optimizer-steps`` signals): a layer whose weights start at zero
  (LoRA's ``lora_B``, a zero-initialised head) passes back an exactly-zero gradient until an
  optimizer step with lr > 0 moved it; with gradient accumulation (a step after every 16th
  pass) and a warmup from lr 0 every recorded pass may come before that step. Zero gradients
  there are a note; once an optimizer that holds the layer has stepped with lr > 0, a warning
  as before. A layer that no optimizer holding it stepped with lr > 0 while tracing (none
  holds it, its lr stayed 0) is not known to move: a warning.
* **Turns**: heads trained by different losses in turns (a GAN's generator, discriminator and
  info losses; five critic passes per generator pass) miss the gradient in some passes. Judged
  by accumulation window, not by pass: a module that got a gradient in every window of an
  optimizer holding it (the passes up to each of its steps, within the recorded ones) trains,
  whatever it missed in the other passes; not detached. One that missed it in a whole window
  (or with no optimizer step to judge by) is judged pass by pass, as before.

Pure: the collected log in, the flow's boundaries and the findings adjusted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.boundary import GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn, ModelFqns

#: causes of a boundary whose victims got no gradient, or an exactly-zero one, in a step: the
#: boundaries modules trained in turns are no victims of (``GradientFlow.drop_victims``)
MISSED = ("detached_inside", "let_go", "unused_calls", "zeroed", "zeroed_unit", "zero_backward")


def trained_in_turns(c: Collected) -> set[ModelFqn]:
    """The modules that missed the gradient in a recorded pass where their model trained
    (called with gradients on, no backward; or every call's gradient exactly zero: a twin
    critic that ``min(q0, q1)`` leaves out of the actor's pass), and yet got a non-zero one in
    every accumulation window of an optimizer that holds them (the passes after its last step
    up to its next one; those within the recorded steps, one at least): each of its steps had
    their gradient."""
    last = max(c.backward_steps, default=-1)
    windows = [(s.model, set(s.detail.get("held") or ()), spans) for s in c.signals
               if s.kind == SignalKind.OPTIMIZER_STEPS
               and (spans := _windows(s.detail.get("after"), last))]
    if not windows:
        return set()  # no optimizer step to judge by
    missed: set[ModelFqn] = set()
    found: dict[tuple[ModelFqns, ModelFqns], ModelFqns] = {}  # the sets are shared between steps
    for step in sorted(c.backward_steps):
        grad, backed = c.grad.get(step, frozenset()), c.backward.get(step, frozenset())
        pair = (grad, backed)
        if pair not in found:
            reached = {key[0] for key in backed}
            found[pair] = frozenset(key for key in grad - backed if key[0] in reached)
        missed |= found[pair]
    got: dict[ModelFqn, set[int]] = {}  # the passes that gave each a non-zero gradient
    zero: dict[ModelFqn, set[int]] = {}  # those that gave one of its calls a zero one
    for call in c.calls:
        if call.backed:
            (zero if call.g_out == 0 else got).setdefault(call.key, set()).add(call.step)
    # every call's gradient zero in a pass, a non-zero one in another
    missed |= {key for key, steps in zero.items() if key in got and steps - got[key]}
    return {key for key in missed if key in got and any(
        model == key[0] and key[1] in held
        and all(any(start < step <= end for step in got[key]) for start, end in spans)
        for model, held, spans in windows)}


def _windows(after: object, last: int) -> list[tuple[int, int]]:
    """An optimizer's accumulation windows that end within the recorded steps: (the pass of
    its step before, the pass of its step]."""
    if not isinstance(after, list):
        return []
    ends = [a for a in after if isinstance(a, int)]
    return [(start, end) for start, end in zip([-1, *ends], ends, strict=False)
            if start < end <= last]


def first_moving(c: Collected, key: ModelFqn) -> int | None:
    """The pass after which an optimizer holding ``key`` first stepped with lr > 0; None where
    none did while tracing (none holds it, or lr stayed 0: nothing says it ever moves)."""
    moved = [p for s in c.signals if s.kind == SignalKind.OPTIMIZER_STEPS and s.model == key[0]
             and key[1] in (s.detail.get("held") or ())
             and isinstance(p := s.detail.get("moving"), int)]
    return min(moved) if moved else None


def zero_before_moving(c: Collected, found: GradientFlow, findings: list[Finding]) -> list[Finding]:
    """``findings`` with the zero-gradient warnings of a layer with zero weights, all in passes
    before an optimizer holding it first stepped with lr > 0, made notes."""
    findings = list(findings)
    for (key, cause), b in found.boundaries.items():
        if cause != "zero_weights" or not b.steps:
            continue
        moving = first_moving(c, key)
        if moving is None or b.steps[-1] > moving:
            continue
        for i, f in enumerate(findings):
            if (f.cause == FindingKind.ZERO_GRADIENT and f.severity == WARNING
                    and f.step == b.steps[0] and f.module == key[1]
                    and f.model == c.model_name(key[0])):
                findings[i] = replace(
                    f, severity=NOTE, evidence={**f.evidence, "moving": moving},
                    message=f.message + ", all before the first optimizer step with lr > 0 "
                    f"(after step {moving}): its weights have not moved yet")
    return findings

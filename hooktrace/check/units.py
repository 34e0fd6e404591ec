"""Judging in the units training uses: optimizer steps and turns, not backward passes.

* **Optimizer steps** (the ``optimizer-steps`` signals): a layer whose weights start at zero
  (LoRA's ``lora_B``, a zero-initialised head) passes back an exactly-zero gradient until an
  optimizer step with lr > 0 moved it; with gradient accumulation (a step after every 16th
  pass) and a warmup from lr 0 every recorded pass may come before that step. Zero gradients
  there are a note; once an optimizer that holds the layer has stepped with lr > 0, a warning
  as before. A layer that no optimizer holding it stepped with lr > 0 while tracing (none
  holds it, its lr stayed 0) is not known to move: a warning.
* **Turns**: heads trained by different losses in turns (a GAN's generator, discriminator and
  info losses; five critic passes per generator pass) miss the gradient in some passes and get
  it in later ones. A module that got a gradient in a recorded pass after one where it missed
  it, while its model trained, is trained in turns: not detached. One that got it, then missed
  it in every pass after, still is.

Pure: the collected log in, the flow's boundaries and the findings adjusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, Keys, ModuleKey
    from hooktrace.check.flow import Flow

#: causes of a boundary whose victims got no gradient at all in a step (not a zero one)
_MISSED = ("detached_inside", "unused_calls")


def trained_in_turns(c: Collected) -> set[ModuleKey]:
    """The modules that, in the recorded steps, missed the gradient in a pass where their model
    trained (called with gradients on, no backward) and got it in a later pass."""
    first_miss: dict[ModuleKey, int] = {}
    last_got: dict[ModuleKey, int] = {}
    missed: dict[tuple[Keys, Keys], Keys] = {}  # the sets are shared between steps
    for step in sorted(c.backward_steps):
        grad, backed = c.grad.get(step, frozenset()), c.backward.get(step, frozenset())
        pair = (grad, backed)
        if pair not in missed:
            reached = {key[0] for key in backed}
            missed[pair] = frozenset(key for key in grad - backed if key[0] in reached)
        for key in missed[pair]:
            first_miss.setdefault(key, step)
        for key in backed:
            last_got[key] = step
    return {key for key, step in first_miss.items() if last_got.get(key, -1) > step}


def drop_turns(found: Flow, turns: set[ModuleKey]) -> None:
    """The modules trained in turns are no victims of a boundary that starves them of any
    gradient; a boundary left with none is none."""
    for bkey, b in list(found.boundaries.items()):
        if b.cause in _MISSED and turns.intersection(b.victims):
            for key in turns.intersection(b.victims):
                del b.victims[key]
            if not b.victims:
                del found.boundaries[bkey]


def first_moving(c: Collected, key: ModuleKey) -> int | None:
    """The pass after which an optimizer holding ``key`` first stepped with lr > 0; None where
    none did while tracing (none holds it, or lr stayed 0: nothing says it ever moves)."""
    moved = [p for s in c.signals if s.kind == "optimizer-steps" and s.model == key[0]
             and key[1] in (s.detail.get("held") or ())
             and isinstance(p := s.detail.get("moving"), int)]
    return min(moved) if moved else None


def zero_before_moving(c: Collected, found: Flow, findings: list[Finding]) -> None:
    """Zero-gradient warnings of a layer with zero weights, all in passes before an optimizer
    holding it first stepped with lr > 0: notes."""
    for (key, cause), b in found.boundaries.items():
        if cause != "zero_weights" or not b.steps:
            continue
        moving = first_moving(c, key)
        if moving is None or b.steps[-1] > moving:
            continue
        for f in findings:
            if (f.kind == "zero-gradient" and f.severity == WARNING and f.step == b.steps[0]
                    and f.module == key[1] and f.model == c.model_name(key[0])):
                f.severity = NOTE
                f.message += (", all before the first optimizer step with lr > 0 (after step "
                              f"{moving}): its weights have not moved yet")
                f.evidence["moving"] = moving

"""Findings on parameters frozen or unfrozen while the run goes on (``trainable-changed``
signals): layers an evaluation helper froze and nothing unfroze (no lost gradient for the flow
findings), and when a layer was unfrozen (for the not-optimized finding and the frozen
note). Pure: a ``Collected`` in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import WARNING, Finding, names_text
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.boundary import GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


def unfrozen_at(c: Collected) -> dict[ModelFqn, int]:
    """Per module made trainable during the run (``trainable-changed``), the step it was."""
    return {(s.model, name): s.step for s in c.signals if s.kind == SignalKind.TRAINABLE_CHANGED
            for name in s.detail.get("unfrozen", [])}


def frozen_since(c: Collected) -> dict[ModelFqn, int]:
    """Per module frozen during the run and not made trainable again, from which step (the
    first recorded backward pass that found it frozen)."""
    out: dict[ModelFqn, int] = {}
    for s in c.signals:
        if s.kind == SignalKind.TRAINABLE_CHANGED:
            for name in s.detail.get("frozen", []):
                out.setdefault((s.model, name), s.step)
            for name in s.detail.get("unfrozen", []):
                out.pop((s.model, name), None)
    return out


def toggled(c: Collected) -> set[ModelFqn]:
    """Modules unfrozen again after a freeze during the run: the loop itself turns their
    ``requires_grad`` off and on (a GAN's discriminator, frozen around the generator's pass),
    so their last freeze is one more turn, not a helper that forgot to undo it."""
    frozen: set[ModelFqn] = set()
    out: set[ModelFqn] = set()
    for s in c.signals:
        if s.kind == SignalKind.TRAINABLE_CHANGED:
            frozen.update((s.model, name) for name in s.detail.get("frozen", []))
            out.update(key for name in s.detail.get("unfrozen", [])
                       if (key := (s.model, name)) in frozen)
    return out


def frozen_from_start(c: Collected) -> set[ModelFqn]:
    """Modules frozen for the rest of the run before any backward reached them (inside the
    first forward, after their module record was written): frozen as far as training goes,
    as their record would say had it been written after the freeze."""
    return {key for key, step in frozen_since(c).items() if key in c.modules and not any(
        key in keys for before, keys in c.backward.items() if before < step)}


def drop_frozen(c: Collected, found: GradientFlow) -> None:
    """Boundaries whose starved modules were all frozen during the run by the loop (the
    ``frozen-during-run`` finding says so) in every step they starved: no gradient is lost."""
    since = frozen_since(c)
    for key, b in list(found.boundaries.items()):
        if b.victims and all(v in since and since[v] <= b.steps[0] for v in b.victims):
            del found.boundaries[key]


def frozen_during_run(c: Collected) -> list[Finding]:
    """Modules that got gradients and were then frozen for the rest of the run, while their
    model went on training: ``requires_grad_(False)`` in an evaluation or feature-extraction
    helper (to save memory) that nothing undid. Modules the loop freezes and unfreezes in turns
    (``toggled``) are not said: the run's end falls in one of their frozen turns."""
    by_model: dict[int, dict[str, int]] = {}
    turns = toggled(c)
    for (model, name), step in frozen_since(c).items():
        if (model, name) in turns:
            continue
        if any((model, name) in keys for before, keys in c.backward.items() if before < step
               ) and any(key[0] == model for key in c.backward.get(step, ())):
            by_model.setdefault(model, {})[name] = step
    out = []
    for model, names in sorted(by_model.items()):
        modules = sorted(names, key=lambda name: _first_seq(c, model, name))
        step = min(names.values())
        out.append(Finding(
            "frozen-during-run", WARNING, c.model_name(model), modules[0], step,
            f"{names_text(modules)} ({plural(len(modules), 'module')} of model "
            f"'{c.model_name(model)}') got gradients, then were frozen (requires_grad=False) "
            f"from step {step} on while the model trained: they stopped training",
            {"modules": modules},
            "something between the steps called requires_grad_(False) on them (an evaluation "
            "or feature-extraction helper, a freeze schedule) and nothing set it back: use "
            "torch.no_grad() in the helper instead, or restore requires_grad_(True) after it"))
    return out


def _first_seq(c: Collected, model: int, name: str) -> int:
    m = c.modules.get((model, name))
    return m.first_seq or 0 if m is not None else 0


def trainable_at(c: Collected, model: int, step: int) -> set[str]:
    """The modules of ``model`` with trainable parameters at ``step``: as first seen, then as
    the ``trainable-changed`` signals up to ``step`` changed them."""
    trains = {name for (m, name), stats in c.modules.items() if m == model and stats.trainable}
    for s in c.signals:
        if s.kind == SignalKind.TRAINABLE_CHANGED and s.model == model and s.step <= step:
            trains -= set(s.detail.get("frozen", []))
            trains |= set(s.detail.get("unfrozen", []))
    return trains

"""What trains when: parameters frozen or unfrozen while the run goes on (``trainable-changed``
signals), the modes that change what trains (backward in eval mode, frozen BatchNorms in train
mode), and judging in the units training uses, optimizer steps and turns, not backward passes:
a layer whose weights start at zero (LoRA's ``lora_B``) passes back a zero gradient until an
optimizer step with lr > 0 moved it, and heads trained by different losses in turns (a GAN's
generator and discriminator, five critic passes per generator pass) miss the gradient in some
passes by design. Pure: a ``Collected`` in; findings out, the flow's boundaries and findings
adjusted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, names_text
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.boundary import GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn, ModelFqns
    from hooktrace.log.schema import Signal

#: causes of a boundary whose victims got no gradient, or an exactly-zero one, in a step: the
#: boundaries modules trained in turns are no victims of (``GradientFlow.drop_victims``)
MISSED = ("detached_inside", "let_go", "unused_calls", "zeroed", "zeroed_unit", "zero_backward")


def _changes(c: Collected) -> list[Signal]:
    return [s for s in c.signals if s.kind == SignalKind.TRAINABLE_CHANGED]


def unfrozen_at(c: Collected) -> dict[ModelFqn, int]:
    """Per module made trainable during the run, the step it was."""
    return {(s.model, name): s.step for s in _changes(c) for name in s.detail.get("unfrozen", [])}


def frozen_since(c: Collected) -> dict[ModelFqn, int]:
    """Per module frozen during the run and not made trainable again, from which step (the
    first recorded backward pass that found it frozen)."""
    out: dict[ModelFqn, int] = {}
    for s in _changes(c):
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
    for s in _changes(c):
        frozen.update((s.model, name) for name in s.detail.get("frozen", []))
        out.update(key for name in s.detail.get("unfrozen", [])
                   if (key := (s.model, name)) in frozen)
    return out


def frozen_from_start(c: Collected) -> set[ModelFqn]:
    """Modules frozen for the rest of the run before any backward reached them (inside the
    first forward, after their module record was written): frozen as far as training goes."""
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
    """Modules that got gradients and were then frozen for the rest of the run while their
    model went on training (an evaluation helper's ``requires_grad_(False)`` nothing undid);
    not those the loop freezes and unfreezes in turns (``toggled``)."""
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
        modules = sorted(names, key=lambda name: c.first_seq(model, name))
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


def trainable_at(c: Collected, model: int, step: int) -> set[str]:
    """The modules of ``model`` with trainable parameters at ``step``."""
    trains = {name for (m, name), stats in c.modules.items() if m == model and stats.trainable}
    for s in _changes(c):
        if s.model == model and s.step <= step:
            trains -= set(s.detail.get("frozen", []))
            trains |= set(s.detail.get("unfrozen", []))
    return trains


def eval_backward(c: Collected, s: Signal) -> list[Finding]:
    """Backward in eval mode: a warning where it changes what trains (BatchNorm normalising
    with its running statistics, dropout off), silent where it does not (linear probing) or
    where no optimizer steps the model (Grad-CAM, saliency: a backward that explains it)."""
    if not any(o.kind == SignalKind.OPTIMIZER_STEPS and o.model == s.model
               and o.detail.get("after") for o in c.signals):
        return []
    layers = modal_training(c, s.model, s.step)
    if not layers:
        return []  # what trains acts the same in eval mode (linear probing a frozen backbone)
    # only drop layers, in a model with a frozen part: a head trained on a frozen backbone in
    # eval mode on purpose, its dropout off (a note)
    probing = all(c.modules[(s.model, name)].drop is not None for name in layers) and any(
        m.model == s.model and m.params and not m.trainable for m in c.modules.values())
    what = ("its dropout is off in what trains (a head trained on a frozen backbone in eval "
            "mode: linear probing?)" if probing else "dropout is off, and BatchNorm normalises "
            "with its running statistics and does not update them")
    return [Finding(
        FindingKind.EVAL_BACKWARD, NOTE if probing else WARNING, c.model_name(s.model), s.fqn,
        s.step,
        f"model '{c.model_name(s.model)}' ran backward in eval mode (model.training is False) "
        f"from step {s.step} on: {what} ({names_text(layers, 3)} in what trains)",
        {"layers": layers[:20]},
        "call model.train() again after a validation pass (model.eval()) before training on")]


def modal_training(c: Collected, model: int, step: int) -> list[str]:
    """The layers of ``model`` that act differently in train and eval mode and belong to what
    trains at ``step``: a BatchNorm whose own parameters train (one without parameters, or a
    drop layer of p > 0, whose parent's other modules train)."""
    trains = trainable_at(c, model, step)
    out = []
    for (m, name), stats in c.modules.items():
        if m != model or not stats.calls:
            continue
        norm = "BatchNorm" in stats.cls or "InstanceNorm" in stats.cls
        if norm and stats.params:
            if name in trains:
                out.append(name)
        elif norm or (stats.drop is not None and stats.drop[0] > 0):
            parent = name.rpartition(".")[0]
            if any(t != name and (parent == "" or t.startswith(parent + ".")) for t in trains):
                out.append(name)
    return sorted(out, key=lambda name: c.first_seq(model, name))


def frozen_bn_training(c: Collected, s: Signal) -> list[Finding]:
    return [Finding(
        FindingKind.FROZEN_BN_TRAINING, NOTE, c.model_name(s.model), s.fqn, s.step,
        f"{c.label(s.model, s.fqn)} is frozen (no trainable parameters) but in train mode: "
        "its running statistics still change with every batch",
        {}, "call .eval() on frozen BatchNorm layers after model.train() if they should "
        "stay as loaded")]


def trained_in_turns(c: Collected) -> set[ModelFqn]:
    """The modules that missed the gradient in a recorded pass where their model trained
    (called with gradients on, no backward; or every call's gradient exactly zero: a twin
    critic that ``min(q0, q1)`` leaves out of the actor's pass), and yet got a non-zero one in
    every accumulation window of an optimizer that holds them (the passes after its last step
    up to its next one, within the recorded steps, one at least)."""
    last = max(c.backward_steps, default=-1)
    windows = []
    for s in c.signals:
        after = s.detail.get("after") if s.kind == SignalKind.OPTIMIZER_STEPS else None
        ends = [a for a in after if isinstance(a, int)] if isinstance(after, list) else []
        spans = [(start, end) for start, end in zip([-1, *ends], ends, strict=False)
                 if start < end <= last]
        if spans:
            windows.append((s.model, set(s.detail.get("held") or ()), spans))
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


def zero_before_moving(c: Collected, found: GradientFlow, findings: list[Finding]) -> list[Finding]:
    """``findings`` with the zero-gradient warnings of a layer with zero weights, all in passes
    before an optimizer holding it first stepped with lr > 0, made notes (none stepped so
    while tracing: nothing says it ever moves, the warning stays)."""
    findings = list(findings)
    for (key, cause), b in found.boundaries.items():
        if cause != "zero_weights" or not b.steps:
            continue
        moved = [p for s in c.signals if s.kind == SignalKind.OPTIMIZER_STEPS
                 and s.model == key[0] and key[1] in (s.detail.get("held") or ())
                 and isinstance(p := s.detail.get("moving"), int)]
        if not moved or b.steps[-1] > (moving := min(moved)):
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

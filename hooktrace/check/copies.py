"""Evaluation copies: modules with trainable parameters that no optimizer holds and that only
ever ran in evaluation passes, under ``torch.no_grad()`` or in eval mode with no backward (an
EMA copy that keeps ``requires_grad=True``, as timm's ``ModelEmaV3`` does, validated between
steps inside the task that trains the model). Nothing would train them, so no gradient is
lost: they are not judged as training, and one note per model says what they are. A forward
under ``no_grad`` by mistake is not one of them: the optimizer holds what it should train.
Their boundaries go with ``GradientFlow.drop_victims``. Pure: a ``Collected`` in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding
from hooktrace.check.grouped import cover, patterns
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


def evaluation_copies(c: Collected) -> set[ModelFqn]:
    """The modules no optimizer that stepped holds (the last ``optimizers`` signal of their
    model) that ran in evaluation passes only (under no_grad, or in eval mode with gradients
    on) and never got a backward."""
    last = {s.model: s for s in c.signals if s.kind == SignalKind.OPTIMIZERS}
    not_held = {(model, name) for model, s in last.items()
                for name in s.detail.get("not_held") or ()}
    if not not_held:
        return set()
    ran = {key for keys in c.no_grad.values() for key in keys}
    ran |= {key for keys in c.eval_mode.values() for key in keys}
    trained = {key for step, keys in c.grad.items()
               for key in keys - c.eval_mode.get(step, frozenset())}
    trained |= {key for keys in c.backward.values() for key in keys}
    return {key for key in not_held & ran if key not in trained}


def copies_notes(c: Collected, copies: set[ModelFqn]) -> list[Finding]:
    """One note per model with evaluation copies, their subtrees listed."""
    out = []
    for model in sorted({key[0] for key in copies}):
        names = sorted(name for m, name in copies if m == model)
        tops = cover(c, model, names)
        out.append(Finding(
            "evaluation-copy", NOTE, c.model_name(model), tops[0], None,
            f"{patterns(tops)} ({plural(len(names), 'module')} with trainable parameters) ran "
            f"only {_how(c, {(model, name) for name in names})}, and no optimizer holds them: "
            "an evaluation or EMA copy, not judged as training",
            {"modules": names},
            "freeze it with .requires_grad_(False) to say so; if it should train, add its "
            "parameters to the optimizer and run its forward with gradients on"))
    return out


def _how(c: Collected, keys: set[ModelFqn]) -> str:
    """How the copies ran: under no_grad, in eval mode with gradients on, or both."""
    no_grad = any(keys.intersection(found) for found in c.no_grad.values())
    evaluated = any(keys.intersection(found) for found in c.eval_mode.values())
    return {(True, False): "under torch.no_grad", (False, True): "in eval mode, with no backward"
            }.get((no_grad, evaluated), "under torch.no_grad or in eval mode, with no backward")

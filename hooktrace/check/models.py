"""How the models of a run relate over the recorded steps, stated as facts, one per model: the
optimizer that trains it and after which backward passes, the losses it learns from, the model
it is a copy or a moving average of, when it is frozen, whether a backward pass ever reached it.
Pure: a ``Collected`` in, facts out; facts are not findings (they count as no problem), and a
run of one model has none to state.

Read from what the log has: the ``optimizer-steps``, ``loss-ops``, ``twins`` and
``trainable-changed`` signals, the module records (what was trainable at first) and the modules
each backward pass reached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import steps_text
from hooktrace.check.relations import Looks, follows, twin_looks
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqns


@dataclass
class ModelFacts:
    """What one model was over the recorded steps (``hooktrace check``'s Models block)."""

    model: str
    cls: str  # its root's class, "" for a model the run never called (a twin by its variable)
    # each optimizer that stepped it: {"optimizer": class, "steps": count, "after": [passes]}
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    losses: list[dict[str, str]] = field(default_factory=list)  # {"loss": op, "on": model}
    copy_of: str | None = None  # the trained model of its structure whose weights it held
    copied_at: list[int] = field(default_factory=list)  # the steps it held them
    average: bool = False  # changed at every look, stepped by no optimizer: a moving average
    frozen: str | None = None  # "throughout", "in turns", "from", "until", "at" (see text)
    frozen_steps: list[int] = field(default_factory=list)  # the backward passes it was frozen
    called: bool = True  # the run called it (a twin known by its variable only: not)
    recorded: bool = True  # called in a recorded step (else its calls were only watched)
    backward: bool = True  # a backward pass reached it
    no_grad_only: bool = False  # every call ran under torch.no_grad
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` lists it: ``cls`` named ``class``, as in the log's model records."""
        return {("class" if k == "cls" else k): v for k, v in asdict(self).items()}


def model_facts(c: Collected) -> list[ModelFacts]:
    """The facts of each model with parameters (and each twin known by its variable only), in
    the order they were first seen; none where the run has fewer than two."""
    ids = [m for m in sorted(c.models) if any(s.params for s in c.modules.values()
                                              if s.model == m)]
    looks = twin_looks(c)
    names = [c.model_name(m) for m in ids]
    names += sorted(n for n in looks if n not in names)
    if len(names) < 2:
        return []
    by_name = {c.model_name(m): m for m in ids}
    out = []
    for name in names:
        model = by_name.get(name)
        root = c.modules.get((model, "")) if model is not None else None
        facts = ModelFacts(name, root.cls if root else "", called=model is not None,
                           backward=model is not None)
        if model is not None:
            facts.optimizers = _optimizers(c, model)
            facts.losses = _losses(c, model, facts.optimizers)
            _frozen(c, model, facts)
            _reached(c, model, facts)
        if name in looks:
            _twin(c, name, looks, facts)
        facts.text = _text(c, facts)
        out.append(facts)
    return out


def _optimizers(c: Collected, model: int) -> list[dict[str, Any]]:
    return [{"optimizer": s.detail.get("optimizer", "?"), "steps": s.detail.get("count", 0),
             "after": [a for a in s.detail.get("after") or [] if a >= 0]}
            for s in c.signals if s.kind == SignalKind.OPTIMIZER_STEPS and s.model == model]


def _losses(c: Collected, model: int, optimizers: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The losses that read its output; for a model trained through another's (a GAN's
    generator through the discriminator), those that read the outputs of the models its
    optimizer's passes reached."""
    said = sorted({(s.detail.get("loss", "?"), s.model) for s in c.signals
                   if s.kind == SignalKind.LOSS_OPS})
    own = [(loss, m) for loss, m in said if m == model]
    if not own and optimizers:
        passes = {p for o in optimizers for p in o["after"]}
        reached = {key[0] for p in passes for key in c.backward.get(p, ())}
        own = [(loss, m) for loss, m in said if m in reached]
    return [{"loss": loss, "on": c.model_name(m)} for loss, m in own]


def _frozen(c: Collected, model: int, facts: ModelFacts) -> None:
    """Frozen throughout, or in which backward passes (``trainable-changed`` signals)."""
    with_params = {s.fqn for s in c.modules.values() if s.model == model and s.params}
    frozen = {s.fqn for s in c.modules.values()
              if s.model == model and s.params and not s.trainable}
    changes = [s for s in c.signals if s.kind == SignalKind.TRAINABLE_CHANGED and s.model == model]
    if not changes:
        if with_params and frozen == with_params:
            facts.frozen = "throughout"
        return
    steps = []
    for step in sorted(c.backward_steps):
        for s in changes:
            if s.step == step:
                frozen = (frozen | set(s.detail.get("frozen", []))) - set(
                    s.detail.get("unfrozen", []))
        if frozen == with_params:
            steps.append(step)
    if not steps:
        return
    every = sorted(c.backward_steps)
    runs = sum(1 for i, s in enumerate(steps) if i == 0 or every.index(s) != every.index(
        steps[i - 1]) + 1)
    facts.frozen_steps = steps
    facts.frozen = ("throughout" if steps == every else "in turns" if runs > 1
                    else "from" if steps[-1] == every[-1]
                    else "until" if steps[0] == every[0] else "at")


def _reached(c: Collected, model: int, facts: ModelFacts) -> None:
    def ran(steps: dict[int, ModelFqns]) -> bool:
        return any(key[0] == model for keys in steps.values() for key in keys)
    facts.backward = ran(c.backward)
    facts.recorded = ran(c.grad) or ran(c.no_grad)  # a model record: it was called
    facts.no_grad_only = facts.recorded and not ran(c.grad)


def _twin(c: Collected, name: str, looks: dict[str, Looks], facts: ModelFacts) -> None:
    """The trained model of its structure whose weights it held, or that it follows."""
    m = looks[name]
    if m.trained:
        return
    held = {o for found in m.same.values() for o in found}
    if follows(m):  # a moving average holds no one's weights after its first look
        held |= {o for s in c.signals
                 if s.kind == SignalKind.TWINS and name in s.detail.get("models", [])
                 for o in s.detail.get("models", [])}
    trained = sorted(o for o in held if o in looks and looks[o].trained)
    if not trained:
        return
    facts.copy_of = trained[0]
    facts.copied_at = [step for step in m.looks if facts.copy_of in m.same[step]]
    # changed at every look, each time into the weights it copies: a copy, not an average
    facts.average = follows(m) and not set(m.looks[1:]) <= set(facts.copied_at)


def _text(c: Collected, f: ModelFacts) -> str:
    every = sorted(c.backward_steps)
    parts = []
    for o in f.optimizers:
        when = "after every backward pass" if o["after"] == every else \
            f"after the backward passes of {steps_text(o['after'])}"
        parts.append(f"trained by {o['optimizer']} {when}")
    for on in sorted({loss["on"] for loss in f.losses}, key=lambda o: o != f.model):
        ops = [loss["loss"] for loss in f.losses if loss["on"] == on]
        where = "" if on == f.model else f" on {on}'s output"
        parts.append(f"loss{'es' if len(ops) > 1 else ''} {' and '.join(ops)}{where}")
    if f.copy_of and f.average:
        start = "started as its copy, " if f.copied_at[:1] == every[:1] else ""
        parts.append(f"a moving average of {f.copy_of} ({start}changed at every step, "
                     "stepped by no optimizer)")
    elif f.copy_of:
        parts.append(f"a copy of {f.copy_of} (the same weights at {steps_text(f.copied_at)})")
    if not f.optimizers and not f.average and f.frozen != "throughout":
        parts.append("stepped by no optimizer")
    if f.frozen:
        parts.append(_frozen_text(f))
    if not f.called:
        parts.append("never called")
    elif not f.recorded:
        parts.append("called only in steps not recorded (run --steps to record one of them)")
    elif not f.backward:
        parts.append("evaluated only, under torch.no_grad" if f.no_grad_only
                     else "evaluated only (no backward pass reached it)")
    label = f"{f.model} ({f.cls})" if f.cls else f.model
    return f"{label}: " + "; ".join(parts)


def _frozen_text(f: ModelFacts) -> str:
    steps = f.frozen_steps
    if f.frozen == "throughout":
        return "frozen throughout"
    if f.frozen == "in turns":
        return f"frozen in turns: in the backward passes of {steps_text(steps)}"
    if f.frozen == "from":
        return f"frozen from step {steps[0]} on"
    if f.frozen == "until":
        return f"frozen until step {steps[-1]}, trainable after"
    return f"frozen in the backward passes of {steps_text(steps)}"

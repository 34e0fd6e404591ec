"""How models relate over the recorded steps (``twins`` signals, module aliases), and the
relations that contradict each other. Pure: a ``Collected`` in.

* ``weights-replaced``: a model an optimizer trains whose weights, between its step and its
  next pass, became those of a copy that follows it (changed at every look, stepped by no
  optimizer: a moving average), and stayed so: validation with the EMA weights that never
  restores the live ones undoes the training since the copy fell behind, every time;
* ``copied-every-step``: a copy no optimizer steps that holds the trained model's weights at
  every look, three or more in a row, while those change: a target network updated by a full
  copy each step (``load_state_dict``, a soft update with tau 1) is the trained network;
* ``copy-not-updated``: a copy that started with the trained model's weights, that the run
  calls, and whose name or class says it follows the model (``ema``, an average, momentum,
  shadow weights), never changes over three or more looks while the model does: its update
  writes into nothing (a loop variable rebound);
* ``shared-target``: a BYOL, MoCo or mean-teacher target made without ``copy.deepcopy`` is the
  online module under a second name: freezing the target froze the online network, which runs
  with gradients and under ``torch.no_grad()`` with the same parameters and never trains.

A copy updated as a moving average (a mean teacher, a soft-updated target), weights swapped in
for validation and restored, a target copied every few steps, a frozen reference copy not named
as a follower, models of different structures (a teacher and its student), a frozen module
held under one name (a perceptual loss's features), shared parameters that train (tied
embeddings) and one encoder run twice with gradients (a siamese network) are not these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, names_text, steps_text
from hooktrace.check.trainable import unfrozen_at
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn

RUN = 3  # looks in a row: a relation seen once or twice may be a schedule's (a copy every N)
# the words of a copy meant to follow its model: in a variable's name (its words) or a class's
_FOLLOWER_WORDS = {"ema", "avg", "average", "averaged", "swa", "momentum", "shadow", "polyak"}
_FOLLOWER_CLASS = re.compile(r"Ema|EMA|Averag|SWA|Swa|Momentum|Shadow")


@dataclass
class Looks:
    """A model's looks: the steps, and at each whether it changed since the last look."""

    looks: list[int] = field(default_factory=list)
    changed: dict[int, bool] = field(default_factory=dict)  # step -> changed (None: first)
    same: dict[int, set[str]] = field(default_factory=dict)  # step -> models with its weights
    replaced: list[int] = field(default_factory=list)
    trained: bool = False


def twin_looks(c: Collected) -> dict[str, Looks]:
    """Each model of the ``twins`` signals, by name: its looks."""
    out: dict[str, Looks] = {}
    for s in c.signals:
        if s.kind != SignalKind.TWINS:
            continue
        d: dict[str, Any] = s.detail
        for name in d.get("models", []):
            m = out.setdefault(name, Looks())
            m.looks.append(s.step)
            if name in d.get("changed", []) or name in d.get("unchanged", []):
                m.changed[s.step] = name in d.get("changed", [])
            m.same[s.step] = {o for group in d.get("same", []) if name in group
                              for o in group if o != name}
            m.trained |= name in d.get("trained", [])
            if name in d.get("replaced", []):
                m.replaced.append(s.step)
    return out


def follows(m: Looks) -> bool:
    """Changed at every look after its first (two or more), stepped by no optimizer."""
    return not m.trained and len(m.changed) >= 2 and all(m.changed.values())


def check_relations(c: Collected) -> list[Finding]:
    models = twin_looks(c)
    out: list[Finding] = []
    for name, m in models.items():
        out += _replaced(c, name, m, models)
        if not m.trained:
            out += _copied(c, name, m, models) or _not_updated(c, name, m, models)
    return out


def _replaced(c: Collected, name: str, m: Looks, models: dict[str, Looks]) -> list[Finding]:
    if not m.trained or not m.replaced:
        return []
    sources = sorted({o for step in m.replaced for o in m.same[step] if follows(models[o])})
    if not sources:
        return []
    source = sources[0]
    return [Finding(
        "weights-replaced", WARNING, name, "", m.replaced[0],
        f"model '{name}' trained on from the weights of {source} at "
        f"{steps_text(m.replaced)}: between its optimizer step and its next backward pass its "
        f"weights were replaced by those of {source}, a copy that follows it (changed at every "
        f"step, stepped by no optimizer: a moving average), and were not put back: each "
        f"copy undoes the training {source} has not caught up with",
        {"from": source, "steps": m.replaced[:20]},
        f"to validate with the weights of {source}, keep the live weights first (live = "
        f"copy.deepcopy(model.state_dict()), or ema.store()) and load them back after the "
        f"validation (model.load_state_dict(live), or ema.restore()); or validate {source} "
        f"itself")]


def _trained(models: dict[str, Looks], names: set[str]) -> list[tuple[str, Looks]]:
    """Of ``names``, in order, the models an optimizer trains, with their looks."""
    return [(other, models[other]) for other in sorted(names) if models[other].trained]


def _copied(c: Collected, name: str, m: Looks, models: dict[str, Looks]) -> list[Finding]:
    for other, o in _trained(models, {o for found in m.same.values() for o in found}):
        run = _longest(m.looks, lambda step, o=o, other=other: other in m.same[step]
                       and o.changed.get(step) is True)
        if len(run) >= RUN:
            return [Finding(
                "copied-every-step", WARNING, name, "", run[0],
                f"model '{name}' holds the weights of {other} at every recorded step of "
                f"{steps_text(run)}, each time {other} changed: it is a full copy of {other} "
                f"made at every step (load_state_dict, or a soft update with tau = 1), so it "
                f"follows {other} with no delay; a target network meant to lag behind is "
                f"{other} itself",
                {"copy_of": other, "steps": run[:20]},
                f"update it softly under torch.no_grad() (p_{name}.lerp_(p, tau) with tau "
                f"about 0.005 for each pair of parameters), or copy {other} every N steps, "
                f"not at every step")]
    return []


def _not_updated(c: Collected, name: str, m: Looks, models: dict[str, Looks]
                 ) -> list[Finding]:
    if not m.looks or not _named_follower(c, name):
        return []
    later = m.looks[1:]
    for other, o in _trained(models, m.same[m.looks[0]]):
        if len(later) < RUN or any(
                m.changed.get(step) is not False or o.changed.get(step) is not True
                for step in later):
            continue
        return [Finding(
            "copy-not-updated", WARNING, name, "", m.looks[0],
            f"model '{name}' started as a copy of {other} (the same weights at step "
            f"{m.looks[0]}) and never changed over {steps_text(later)} while {other} trained, "
            f"though it is named as a copy that follows {other} (a moving average): its "
            f"update writes into none of its parameters (a loop variable rebound, "
            f"ema_p = decay * ema_p + ..., or new tensors made from them)",
            {"copy_of": other, "steps": later[:20]},
            "update its parameters in place under torch.no_grad(): ema_p.mul_(decay).add_(p, "
            "alpha=1 - decay), or ema_p.lerp_(p, 1 - decay); or use "
            "torch.optim.swa_utils.AveragedModel")]
    return []


def _named_follower(c: Collected, name: str) -> bool:
    """A model the run called whose variable or class names a follower (``model_ema``)."""
    model = next((i for i, n in c.models.items() if n == name), None)
    if model is None:
        return False
    root = c.modules.get((model, ""))
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    return bool(words & _FOLLOWER_WORDS) or (
        root is not None and _FOLLOWER_CLASS.search(root.cls) is not None)


def _longest(steps: list[int], holds: Any) -> list[int]:
    """The longest run of consecutive looks at which ``holds(step)``."""
    best: list[int] = []
    run: list[int] = []
    for step in steps:
        run = [*run, step] if holds(step) else []
        if len(run) > len(best):
            best = run
    return best


def _aliases(c: Collected) -> dict[ModelFqn, list[str]]:
    """Per module held under several names, its other fqns: from its module record (the
    modules below it too) and from the freezes the run saw (``trainable-changed``)."""
    out: dict[ModelFqn, list[str]] = {}
    for m in c.modules.values():
        for alias in m.aliases:
            for o in c.modules.values():
                if o.model == m.model and (o.fqn == m.fqn or o.fqn.startswith(m.fqn + ".")):
                    out.setdefault((o.model, o.fqn), []).append(alias + o.fqn[len(m.fqn):])
    for s in c.signals:
        if s.kind == SignalKind.TRAINABLE_CHANGED:
            for name, others in (s.detail.get("aliases") or {}).items():
                out.setdefault((s.model, name), []).extend(others)
    return out


def _tops(name: str, alias: str) -> tuple[str, str]:
    """The outermost pair of names under which one module is held: ``online_encoder`` and
    ``target_encoder`` for ``online_encoder.net.0`` and ``target_encoder.net.0``."""
    a, b = name.split("."), alias.split(".")
    while len(a) > 1 and len(b) > 1 and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    return ".".join(a), ".".join(b)


def check_shared_targets(c: Collected) -> list[Finding]:
    """One finding per module held under two names whose parameters are frozen for good,
    though an optimizer holds them (meant to train: a frozen network no optimizer holds is
    frozen on purpose), and that ran, in one step, both with gradients (the online network)
    and under no_grad (the target)."""
    unfrozen = unfrozen_at(c)
    held = {(s.model, name) for s in c.signals if s.kind == SignalKind.OPTIMIZERS
            for name in s.detail.get("frozen_held") or ()}
    groups: dict[tuple[int, str, str], list[tuple[str, list[int]]]] = {}
    for key, others in sorted(_aliases(c).items()):
        m = c.modules.get(key)
        if m is None or not m.params or m.trainable or key in unfrozen or key not in held:
            continue
        steps = [step for step in sorted(c.backward_steps)
                 if key in c.grad.get(step, ()) and key in c.no_grad.get(step, ())]
        if steps:
            top, alias = _tops(key[1], others[0])
            groups.setdefault((key[0], top, alias), []).append((key[1], steps))
    return [_shared(c, model, top, alias, found)
            for (model, top, alias), found in sorted(groups.items())]


def _shared(c: Collected, model: int, top: str, alias: str,
            found: list[tuple[str, list[int]]]) -> Finding:
    modules = sorted((name for name, _ in found), key=lambda name: c.first_seq(model, name))
    steps = sorted({step for _, steps in found for step in steps})
    return Finding(
        "shared-target", WARNING, c.model_name(model), top, steps[0],
        f"{c.label(model, top)} is also registered as {alias}: one module, not a copy, so "
        f"the target network runs the online network's own parameters. "
        f"{names_text(modules)} ({plural(len(modules), 'module')} of model "
        f"'{c.model_name(model)}') ran with gradients and under torch.no_grad() in the same "
        f"step, and their parameters are frozen (requires_grad=False): freezing the target "
        f"froze the online network, which never trains",
        {"modules": modules[:50], "aliases": {top: alias}, "steps": steps[:20]},
        f"make the target a copy: {alias} = copy.deepcopy({top}), then freeze the copy and "
        f"update it as a moving average of the online network, which keeps "
        f"requires_grad=True")

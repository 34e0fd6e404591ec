"""How models of one structure relate over the recorded steps (``twins`` signals), and the
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
  writes into nothing (a loop variable rebound).

A copy updated as a moving average (a mean teacher, a soft-updated target), weights swapped in
for validation and restored, a target copied every few steps, a frozen reference copy not named
as a follower, and models of different structures (a teacher and its student) are not these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, steps_text
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected

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


def _copied(c: Collected, name: str, m: Looks, models: dict[str, Looks]) -> list[Finding]:
    for other in sorted({o for found in m.same.values() for o in found}):
        o = models[other]
        if not o.trained:
            continue
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
    for other in sorted(m.same[m.looks[0]]):
        o = models[other]
        later = m.looks[1:]
        if not o.trained or len(later) < RUN or any(
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
    """A model the run called whose variable or class names a follower (``ema``,
    ``model_ema``, ``ModelEmaV3``)."""
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

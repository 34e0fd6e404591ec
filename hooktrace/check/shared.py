"""A target network that is the online network itself (``shared-target``): a BYOL, MoCo or
mean-teacher target made without ``copy.deepcopy`` is the same module under a second name, so
freezing the target froze the online network, which runs with gradients and under
``torch.no_grad()`` with the same parameters and never trains. Pure: a ``Collected`` in.

A frozen module held under one name only (a frozen teacher, a perceptual loss's feature
network), shared parameters that train (tied embeddings) and one encoder run twice with
gradients (a siamese network) are not this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import WARNING, Finding, names_text
from hooktrace.check.trainable import unfrozen_at
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


def aliases(c: Collected) -> dict[ModelFqn, list[str]]:
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


def _both_ways(c: Collected, key: ModelFqn) -> list[int]:
    """The steps with a backward pass in which ``key`` ran with gradients and under no_grad."""
    return [step for step in sorted(c.backward_steps)
            if key in c.grad.get(step, ()) and key in c.no_grad.get(step, ())]


def _frozen_held(c: Collected) -> set[ModelFqn]:
    """Modules whose parameters are all frozen though an optimizer that stepped holds them:
    meant to train (``optimizers`` signals, ``frozen_held``)."""
    return {(s.model, name) for s in c.signals if s.kind == SignalKind.OPTIMIZERS
            for name in s.detail.get("frozen_held") or ()}


def check_shared_targets(c: Collected) -> list[Finding]:
    """One finding per module held under two names whose parameters are frozen for good,
    though an optimizer holds them, and that ran, in one step, both with gradients (the
    online network) and under no_grad (the target). A frozen network no optimizer holds (a
    perceptual loss's features under two names, a frozen embedding shared by an encoder and a
    decoder) is frozen on purpose."""
    unfrozen, held = unfrozen_at(c), _frozen_held(c)
    groups: dict[tuple[int, str, str], list[tuple[str, list[int]]]] = {}
    for key, others in sorted(aliases(c).items()):
        m = c.modules.get(key)
        if m is None or not m.params or m.trainable or key in unfrozen or key not in held:
            continue
        steps = _both_ways(c, key)
        if steps:
            top, alias = _tops(key[1], others[0])
            groups.setdefault((key[0], top, alias), []).append((key[1], steps))
    return [_finding(c, model, top, alias, found)
            for (model, top, alias), found in sorted(groups.items())]


def _finding(c: Collected, model: int, top: str, alias: str,
             found: list[tuple[str, list[int]]]) -> Finding:
    modules = sorted((name for name, _ in found),
                     key=lambda name: (m.first_seq or 0) if (m := c.modules.get((model, name)))
                     else 0)
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

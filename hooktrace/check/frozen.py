"""The frozen modules of a model that run, frozen on purpose, in one note per model: the
subtrees that hold them, each with its role beside what trains (a frozen copy of a trained
module, the base layers of adapters, a frozen backbone). Pure: a ``Collected`` in."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding, names_text
from hooktrace.check.grouped import copies, cover, inside, patterns
from hooktrace.log.names import ancestors
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.keys import ModelFqn

_FROZEN = "parameters frozen (requires_grad=False)"


def frozen_notes(c: Collected, found: list[tuple[ModuleStats, Finding]]) -> list[Finding]:
    """One note per model for its frozen modules that run (``found``: each with its own note,
    kept where it is the model's only one)."""
    by_model: dict[int, list[tuple[ModuleStats, Finding]]] = {}
    for m, f in found:
        by_model.setdefault(m.model, []).append((m, f))
    copied = copies(c)
    return [_note(c, model, by_model[model], copied) for model in sorted(by_model)]


def _note(c: Collected, model: int, found: list[tuple[ModuleStats, Finding]],
          copied: dict[ModelFqn, ModelFqn]) -> Finding:
    names = [m.fqn for m, _ in found]
    tops = [(model, top) for top in cover(c, model, names)]
    copy_tops = [key for key in tops if key in copied]
    rest = [m for m, _ in found if not inside((m.model, m.fqn), copy_tops)]
    adapters = _adapters(c, rest)
    backbone = cover(c, model, [m.fqn for m in rest if m.fqn not in adapters])
    if len(found) == 1 and not copy_tops:
        return found[0][1]
    if not copy_tops and not adapters and len(backbone) == 1:  # one frozen subtree, alone
        return Finding(
            "frozen", NOTE, c.model_name(model), backbone[0], None,
            f"{c.label(model, backbone[0])}: {_FROZEN} in all {len(found)} of its modules "
            f"that have any ({names_text(names)})",
            {"modules": names[:50], "params": sum(m.params for m, _ in found)})
    # with adapters, the rest is the base model they adapt, frozen; else a frozen prefix is a
    # backbone, and a frozen subtree after a trainable module lies among trainable ones
    start = math.inf if adapters else _first_trained(c, model)
    other = [top for top in backbone if c.first_seq(model, top) > start]
    backbone = [top for top in backbone if top not in other]
    roles: list[str] = []
    for key in copy_tops:
        original = copied[key]
        of = c.label(*original) if original[0] == key[0] else (
            f"model '{c.model_name(original[0])}'" if original[1] == "" else
            f"{c.label(*original)} of model '{c.model_name(original[0])}'")
        roles.append(f"{c.label(*key)}, a frozen copy of {of}: a target or EMA copy, updated "
                     "outside the optimizer")
    if adapters:
        trained = sorted({a for found_beside in adapters.values() for a in found_beside})
        roles.append(f"{plural(len(adapters), 'layer')} adapted ({patterns(adapters)}) beside "
                     f"their trainable adapters ({patterns(trained)})")
    if backbone:
        roles.append(f"a frozen backbone ({patterns(backbone)})")
    if other:
        roles.append(f"frozen among trainable modules ({patterns(other)})")
    first = min([key[1] for key in copy_tops] + list(adapters) + backbone + other,
                key=lambda n: c.first_seq(model, n))
    return Finding(
        "frozen", NOTE, c.model_name(model), first, None,
        f"{_FROZEN} in {plural(len(found), 'module')} of model '{c.model_name(model)}': "
        + "; ".join(roles),
        {"modules": names, "params": sum(m.params for m, _ in found),
         "roles": {"copy": {key[1]: copied[key][1] for key in copy_tops},
                   "adapted": list(adapters), "backbone": backbone, "other": other}},
        "; ".join(hint for role, hint in (
            (copy_tops, "a copy follows its original through the update the code does (an "
                        "EMA), not through gradients"),
            (adapters, "only the adapters train, as in LoRA"),
            (backbone or other, "call .requires_grad_(True) on what should train")) if role))


def _first_trained(c: Collected, model: int) -> float:
    """When the first call of a module of ``model`` with trainable parameters returned: a
    frozen subtree before it is a frozen backbone (a prefix), one after it lies among them."""
    return min((m.first_seq or 0 for m in c.modules.values()
                if m.model == model and m.trainable and m.calls), default=math.inf)


def _adapters(c: Collected, frozen: list[ModuleStats]) -> dict[str, list[str]]:
    """The frozen modules that trainable modules beside them adapt: each the one frozen module
    with parameters of its parent's subtree, where others train, fewer parameters than it holds
    (adapters are small), and the parent a called module (peft's ``lora.Linear``: its
    ``base_layer`` beside its ``lora_A`` and ``lora_B``); each with those. Not a frozen layer
    in a ``ModuleList`` of trainable ones (never called), nor a frozen backbone beside a trained
    head (its parent holds many frozen modules)."""
    below: dict[tuple[int, str], tuple[list[str], list[str]]] = {}  # parent: frozen, trainable
    for m in c.modules.values():
        if m.params and m.fqn:
            for parent in ancestors(m.fqn)[1:]:  # not the root
                frozen_below, trained = below.setdefault((m.model, parent), ([], []))
                (trained if m.trainable else frozen_below).append(m.fqn)
    out: dict[str, list[str]] = {}
    for m in frozen:
        parent = m.fqn.rpartition(".")[0]
        if "." not in m.fqn or not getattr(c.modules.get((m.model, parent)), "calls", 0):
            continue  # the root's children (a backbone and a head), or a container's
        frozen_below, trained = below.get((m.model, parent), ([], []))
        if trained and frozen_below == [m.fqn] and sum(
                c.modules[(m.model, name)].trainable for name in trained) < m.params:
            out[m.fqn] = trained
    return out

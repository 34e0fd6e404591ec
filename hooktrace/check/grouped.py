"""Many modules, one cause: the modules of a finding listed in a line (the outermost subtrees
that hold them, numbered layers folded into one pattern), and the roles modules play beside
what trains, each model's in one note: a frozen copy of a trained module (a target or EMA
copy), the base layers of adapters, a frozen backbone, an evaluation copy no optimizer holds.
Pure: a ``Collected`` in, names and notes out."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding, names_text
from hooktrace.log.names import ancestors
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import ROOT, fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.keys import ModelFqn


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def cover(c: Collected, model: int, names: Iterable[str]) -> list[str]:
    """The outermost modules each of whose called modules with parameters is one of ``names``
    (a whole frozen ``features``), or the name itself; in forward order, each once. Linear in
    the modules (times their depth): a count per module of those below it, and of the named."""
    wanted = set(names)
    below: dict[str, int] = {}
    named: dict[str, int] = {}
    for m in c.modules.values():
        if m.model == model and m.params and m.calls:
            for top in [*ancestors(m.fqn), m.fqn]:
                below[top] = below.get(top, 0) + 1
                named[top] = named.get(top, 0) + (m.fqn in wanted)
    out: dict[str, None] = {}
    for name in wanted:
        for top in [*ancestors(name), name]:  # outermost first
            if below.get(top) and below[top] == named[top]:
                out[top] = None
                break
    return sorted(out, key=lambda n: c.first_seq(model, n))


def patterns(names: Iterable[str], keep: int = 10) -> str:
    """``embed, layers.*.k_proj (x32), norm``: numbered layers folded into one pattern each
    (a name alone kept as it is), in the order first met; ``(root)`` for the root; past
    ``keep`` patterns, how many more."""
    counts: dict[str, list[str]] = {}
    for name in names:
        pattern = _INDEX.sub("*", name) if name else ROOT
        counts.setdefault(pattern, []).append(fqn_text(name))
    shown = [found[0] if len(found) == 1 else f"{p} (x{len(found)})"
             for p, found in counts.items()]
    more = f" and {len(shown) - keep} more" if len(shown) > keep else ""
    return ", ".join(shown[:keep]) + more


_Makeup = tuple[tuple[str, str, int], ...]


def _makeups(c: Collected) -> tuple[dict[ModelFqn, _Makeup], set[ModelFqn]]:
    """What each subtree is made of (each module with parameters below it and itself, by its
    name relative to it, its class and its parameter count), and the subtrees some module of
    which trains; one pass over the modules, times their depth. A second path to a module under
    another parent (``alias_of``: BYOL's ``online_encoder.net``, whose first name ``net`` holds
    the parameters) counts with the first name's parameters: a copy of the wrapper that calls
    it is a copy of it all."""
    parts: dict[ModelFqn, list[tuple[str, str, int]]] = {}
    trains: set[ModelFqn] = set()
    for m in c.modules.values():
        first = c.modules.get((m.model, m.alias_of)) if m.alias_of else None
        params, trainable = (m.params, m.trainable) if first is None else (first.params,
                                                                           first.trainable)
        for top in [*ancestors(m.fqn), m.fqn]:
            if params:
                rel = "" if m.fqn == top else m.fqn[len(top) + 1:] if top else m.fqn
                parts.setdefault((m.model, top), []).append((rel, m.cls, params))
            if trainable:
                trains.add((m.model, top))
    return {key: tuple(sorted(found)) for key, found in parts.items()}, trains


def copies(c: Collected) -> dict[ModelFqn, ModelFqn]:
    """Per frozen subtree that is a copy of a module that trains (same modules, classes and
    parameter counts: ``copy.deepcopy`` of it, a BYOL target, an EMA copy), that module. Only
    subtrees called in the run and at least two modules with parameters large."""
    frozen: dict[int, list[str]] = {}
    for m in c.modules.values():
        if m.params and not m.trainable:
            frozen.setdefault(m.model, []).append(m.fqn)
    tops = [(model, top) for model, names in frozen.items() for top in cover(c, model, names)
            if (model, top) in c.modules and c.modules[(model, top)].calls]
    if not tops:
        return {}
    signatures, trains = _makeups(c)
    wanted = {signatures[key]: key for key in tops if len(signatures.get(key, ())) >= 2}
    out: dict[ModelFqn, ModelFqn] = {}
    for key, m in c.modules.items():
        found = wanted.get(signatures.get(key, ())) if m.calls and key in trains else None
        if found is not None and found not in out and not inside(key, [found]):
            out[found] = key
    return out


def inside(key: ModelFqn, tops: Iterable[ModelFqn]) -> bool:
    """``key`` is one of ``tops`` or below one."""
    model, name = key
    return any(m == model and (top == "" or name == top or name.startswith(top + "."))
               for m, top in tops)


# Evaluation copies: modules with trainable parameters that no optimizer holds and that only
# ever ran in evaluation passes, under ``torch.no_grad()`` or in eval mode with no backward (an
# EMA copy that keeps ``requires_grad=True``, as timm's ``ModelEmaV3`` does, validated between
# steps inside the task that trains the model). Nothing would train them, so no gradient is
# lost: they are not judged as training, and one note per model says what they are. A forward
# under ``no_grad`` by mistake is not one of them: the optimizer holds what it should train.
# Their boundaries go with ``GradientFlow.drop_victims``.


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


_FROZEN = "parameters frozen (requires_grad=False)"


def frozen_notes(c: Collected, found: list[tuple[ModuleStats, Finding]],
                 copied: dict[ModelFqn, ModelFqn]) -> list[Finding]:
    """One note per model for its frozen modules that run (``found``: each with its own note,
    kept where it is the model's only one)."""
    by_model: dict[int, list[tuple[ModuleStats, Finding]]] = {}
    for m, f in found:
        by_model.setdefault(m.model, []).append((m, f))
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

"""Many modules, one cause: the modules of a finding listed in a line (the outermost subtrees
that hold them, numbered layers folded into one pattern), and the roles modules play beside
what trains (a frozen copy of a trained module: a target or EMA copy; an evaluation copy no
optimizer holds, below). Pure: a ``Collected`` in, names and notes out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding
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


def _signatures(c: Collected) -> dict[ModelFqn, _Makeup]:
    """What each subtree is made of: each module with parameters below it (and itself), by its
    name relative to it, its class and its parameter count. One pass over the modules, times
    their depth."""
    parts: dict[ModelFqn, list[tuple[str, str, int]]] = {}
    for m in map(partial(_holder, c), c.modules.values()):
        if m.params:
            for top in [*ancestors(m.fqn), m.fqn]:
                rel = "" if m.fqn == top else m.fqn[len(top) + 1:] if top else m.fqn
                parts.setdefault((m.model, top), []).append((rel, m.cls, m.params))
    return {key: tuple(sorted(found)) for key, found in parts.items()}


def _trains(c: Collected) -> set[ModelFqn]:
    """The subtrees some module of which has trainable parameters."""
    out: set[ModelFqn] = set()
    for m in map(partial(_holder, c), c.modules.values()):
        if m.trainable:
            out.update((m.model, top) for top in [*ancestors(m.fqn), m.fqn])
    return out


def _holder(c: Collected, m: ModuleStats) -> ModuleStats:
    """``m``, or for a second path to a module under another parent (``alias_of``: BYOL's
    ``online_encoder.net``, whose first name ``net`` holds the parameters), ``m`` with the
    first name's parameters: a copy of the wrapper that calls it is a copy of it all."""
    first = c.modules.get((m.model, m.alias_of)) if m.alias_of else None
    return m if first is None else replace(m, params=first.params, trainable=first.trainable)


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
    signatures = _signatures(c)
    wanted = {signatures[key]: key for key in tops if len(signatures.get(key, ())) >= 2}
    trains = _trains(c)
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

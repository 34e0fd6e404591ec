"""Many modules, one cause: the modules of a finding listed in a line (the outermost subtrees
that hold them, numbered layers folded into one pattern), and the roles modules play beside
what trains (a frozen copy of a trained module: a target or EMA copy). Pure: a ``Collected``
in, names out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hooktrace.check.findings import ancestors

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleKey

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def cover(c: Collected, model: int, names: Iterable[str]) -> list[str]:
    """The outermost modules each of whose called modules with parameters is one of ``names``
    (a whole frozen ``features``), or the name itself; in forward order, each once."""
    wanted = set(names)
    with_params = [m.name for m in c.modules.values() if m.model == model and m.params
                   and m.calls]
    out: dict[str, None] = {}
    for name in wanted:
        for top in [*ancestors(name), name]:  # outermost first
            below = [n for n in with_params if n == top or top == ""
                     or n.startswith(top + ".")]
            if below and all(n in wanted for n in below):
                out[top] = None
                break
    return sorted(out, key=lambda n: _first_seq(c, model, n))


def _first_seq(c: Collected, model: int, name: str) -> int:
    m = c.modules.get((model, name))
    return m.first_seq or 0 if m is not None else 0


def patterns(names: Iterable[str], keep: int = 10) -> str:
    """``embed, layers.*.k_proj (x32), norm``: numbered layers folded into one pattern each
    (a name alone kept as it is), in the order first met; ``(root)`` for the root; past
    ``keep`` patterns, how many more."""
    counts: dict[str, list[str]] = {}
    for name in names:
        pattern = _INDEX.sub("*", name) if name else "(root)"
        counts.setdefault(pattern, []).append(name or "(root)")
    shown = [found[0] if len(found) == 1 else f"{p} (x{len(found)})"
             for p, found in counts.items()]
    more = f" and {len(shown) - keep} more" if len(shown) > keep else ""
    return ", ".join(shown[:keep]) + more


def _signature(c: Collected, model: int, top: str) -> tuple[tuple[str, str, int], ...]:
    """What a subtree is made of: each module with parameters below ``top`` (and itself), by its
    name relative to ``top``, its class and its parameter count."""
    prefix = top + "." if top else ""
    return tuple(sorted((m.name[len(prefix):] if m.name != top else "", m.cls, m.params)
                        for m in c.modules.values() if m.model == model and m.params
                        and (m.name == top or m.name.startswith(prefix))))


def copies(c: Collected) -> dict[ModuleKey, ModuleKey]:
    """Per frozen subtree that is a copy of a module that trains (same modules, classes and
    parameter counts: ``copy.deepcopy`` of it, a BYOL target, an EMA copy), that module. Only
    subtrees called in the run and at least two modules with parameters large."""
    frozen: dict[int, list[str]] = {}
    for m in c.modules.values():
        if m.params and not m.trainable:
            frozen.setdefault(m.model, []).append(m.name)
    tops = [(model, top) for model, names in frozen.items() for top in cover(c, model, names)
            if (model, top) in c.modules and c.modules[(model, top)].calls]
    wanted = {_signature(c, *key): key for key in tops}
    wanted = {sig: key for sig, key in wanted.items() if len(sig) >= 2}
    if not wanted:
        return {}
    classes = {c.modules[key].cls for key in wanted.values()}
    out: dict[ModuleKey, ModuleKey] = {}
    for m in c.modules.values():
        if m.calls and m.cls in classes:
            key = wanted.get(_signature(c, m.model, m.name))
            if key is not None and key not in out and not inside((m.model, m.name), [key]) \
                    and _trains(c, m.model, m.name):
                out[key] = (m.model, m.name)
    return out


def _trains(c: Collected, model: int, top: str) -> bool:
    """Some module of the subtree ``top`` has trainable parameters."""
    return any(m.trainable for m in c.modules.values() if m.model == model
               and (top == "" or m.name == top or m.name.startswith(top + ".")))


def inside(key: ModuleKey, tops: Iterable[ModuleKey]) -> bool:
    """``key`` is one of ``tops`` or below one."""
    model, name = key
    return any(m == model and (top == "" or name == top or name.startswith(top + "."))
               for m, top in tops)

"""The other names a model holds a module under: where a freeze reached modules registered in
two places (a target network that is the online network itself, not a copy of it)."""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn


def other_names(entry: weakref.ref[nn.Module] | None, names: list[str]) -> dict[str, Any]:
    """``{"aliases": ...}``, per fqn of ``names`` (frozen modules under the model's entry
    module) that the model also holds under other names: those, in ``named_modules`` order;
    ``{}`` where there is none. Asked only when a freeze is seen: it walks the whole tree."""
    root = entry() if entry is not None and names else None
    if root is None:
        return {}
    paths: dict[int, list[str]] = {}  # ids are stable here: every module of the tree is alive
    for name, module in root.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(name)
    held = {name: found for found in paths.values() if len(found) > 1 for name in found}
    aliases = {name: [other for other in held[name] if other != name]
               for name in names if name in held}
    return {"aliases": aliases} if aliases else {}

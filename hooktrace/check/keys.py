"""How ``check`` names a module: its model's index and its fqn, and sets of such names."""

from __future__ import annotations

ModelFqn = tuple[int, str]  # (model, fqn)
ModelFqns = frozenset[ModelFqn]

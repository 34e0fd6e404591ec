"""The unit tier: no torch, no subprocess. Its tests read logs written with the log's own writer
or the real logs checked in under ``logs/`` (``unit.logs.LOGS``; ``logs/make.py`` rewrites them).

Run alone (``pytest tests/unit``), importing torch, torchvision or numpy fails the test that
does it: the readers promise to work without them, and this tier stays fast.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

UNIT = Path(__file__).resolve().parent
FORBIDDEN = ("torch", "torchvision", "numpy")


class _NoHeavyImports(importlib.abc.MetaPathFinder):
    """Fails the import of torch, torchvision and numpy."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> None:
        if name.partition(".")[0] in FORBIDDEN:
            raise ImportError(f"the unit tier must not import {name} (tests/unit/conftest.py)")


def _unit_only(config: pytest.Config) -> bool:
    """Whether this session runs nothing but the unit tier."""
    paths = [Path(a.split("::")[0]).resolve() for a in config.args] or [Path.cwd()]
    return all(p == UNIT or UNIT in p.parents for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    if _unit_only(config):
        assert not any(m in sys.modules for m in FORBIDDEN), "imported before the unit tier"
        sys.meta_path.insert(0, _NoHeavyImports())

"""What ``hooktrace run`` runs, checked before torch is imported: the script or module, where
python would find it, and hooktrace's own options given after it by mistake. No torch here."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from hooktrace.log.errors import HooktraceError


@dataclass
class Target:
    name: str  # script path, or module name with as_module
    args: Sequence[str]
    as_module: bool = False


def set_path(target: Target) -> None:
    """sys.path[0] as python sets it: the script's folder, or the current one with -m."""
    first = os.getcwd() if target.as_module else os.path.dirname(os.path.realpath(target.name))
    if sys.path:
        sys.path[0] = first  # hooktrace's own entry (its bin folder, or the current folder)
    else:
        sys.path.insert(0, first)


def check_target(target: Target, output: Path) -> None:
    """Call after ``set_path``: a module is looked up where python -m would look."""
    if target.as_module:
        try:
            found = importlib.util.find_spec(target.name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise HooktraceError(f"no module named {target.name}")
        return
    path = Path(target.name)
    if not path.exists():
        raise HooktraceError(f"no such script: {target.name}")
    if path.is_dir() and not (path / "__main__.py").exists():
        raise HooktraceError(f"{target.name} is a directory with no __main__.py")
    if output.exists() and path.resolve() == output.resolve():
        raise HooktraceError(f"the log would overwrite the script {target.name}; choose another -o")


def misplaced(target: Target, options: Collection[str], error: str | None = None
              ) -> str | None:
    """The line that says which of ``options`` (hooktrace's own) went to the script, after it;
    None when none did, or when the script failed with an ``error`` (the message of what it
    raised) that names none of them: it failed for another reason (an exit status, argparse's
    included, says nothing of why, so it gets the line)."""
    given = list(dict.fromkeys(arg.split("=", 1)[0] for arg in target.args
                               if arg.split("=", 1)[0] in options))
    if not given or (error is not None and not any(name in error for name in given)):
        return None
    what = "the module" if target.as_module else "the script"
    return (f"{', '.join(given)} came after {target.name}, so {what} got "
            f"{'it' if len(given) == 1 else 'them'}, not hooktrace; hooktrace's own options go "
            f"before {what}: hooktrace run {' '.join(given)} ... "
            f"{'-m ' if target.as_module else ''}{target.name}")

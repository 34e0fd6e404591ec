"""The bench with another version of hooktrace beside this one, in the same interleaved rounds.

    git archive BASE | tar -x -C /tmp/base     # the version to compare with, anywhere
    python -m bench.baseline /tmp/base --workloads W1,W2 --skip-logs \\
        --variants hooktrace,hooktrace_nostats,base_hooktrace,base_hooktrace_nostats

That version's ``hooktrace`` package is copied under another name (``hooktrace_base``, its
imports rewritten) into a temporary folder, so both load in one process; its sessions are the
variants ``base_hooktrace`` and ``base_hooktrace_nostats`` (every step recorded, statistics on
and off), one session active at a time like every variant. The other arguments are the
bench's; ratios to untraced of the two versions are then measured in the same rounds.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from torch import nn

from bench import __main__ as bench
from bench import variants

_IMPORT = re.compile(r"^(\s*)from hooktrace\b", re.MULTILINE)  # the package has no other form


def load(root: Path, folder: Path) -> Any:
    """The ``hooktrace`` package under ``root``, imported as ``hooktrace_base``."""
    copy = folder / "hooktrace_base"
    shutil.copytree(root / "hooktrace", copy)
    for path in copy.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(_IMPORT.sub(r"\1from hooktrace_base", text), encoding="utf-8")
    sys.path.insert(0, str(folder))
    import hooktrace_base  # type: ignore[import-not-found]  # made just above

    return hooktrace_base


def _session(package: Any, stats: bool) -> variants.Opener:
    def open_session(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
        session: AbstractContextManager[Any] = package.trace(log, model=model, steps="all",
                                                             stats=stats)
        return session

    return open_session


def main(argv: list[str]) -> None:
    root, rest = Path(argv[0]), argv[1:]
    with tempfile.TemporaryDirectory(prefix="hooktrace-base-") as folder:
        package = load(root, Path(folder))
        variants.VARIANTS = (*variants.VARIANTS, *(
            variants.Variant(f"base_{name}", f"{label} ({root.name})", _session(package, stats),
                             writes_log=True, extra=True)
            for name, label, stats in (("hooktrace", "base hooktrace (stats on)", True),
                                       ("hooktrace_nostats", "base hooktrace stats=False",
                                        False))))
        bench.main(rest)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Log discovery: the log paths given (quoted globs expanded), opened as the ranks of one run,
and the log of one rank picked. What every command that reads several logs starts with (check,
render, view, export). Standard library and orjson (through the reader) only.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader


def expand(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The paths, with glob patterns (quoted on the command line) expanded; no duplicates."""
    out: list[Path] = []
    for raw in paths:
        text = str(raw)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) and not Path(text).exists() \
            else [text]
        if not matches:
            raise HooktraceError(f"no log matches {text}")
        out.extend(Path(m) for m in matches if Path(m) not in out)
    return out


def open_ranks(paths: Sequence[str | os.PathLike[str]], flow: bool = False) -> list[LogReader]:
    """Readers for the logs, sorted by rank; several must be the ranks of one run. ``flow``:
    see ``LogReader``."""
    readers = [LogReader(p, flow) for p in expand(paths)]
    if len(readers) == 1:
        return readers
    headers = [r.header for r in readers]
    ranks = [h.rank for h in headers]
    problem = ""
    if len(set(ranks)) != len(ranks):
        problem = f"two logs are rank {max(ranks, key=ranks.count)}"
    elif len({h.world_size for h in headers}) > 1:
        problem = f"world sizes differ ({sorted({h.world_size for h in headers})})"
    elif len({tuple(h.argv) for h in headers}) > 1:
        problem = "they ran different commands"
    if problem:
        raise HooktraceError(f"the logs are not the ranks of one run: {problem}")
    return sorted(readers, key=lambda r: r.header.rank)


def pick_rank(paths: Sequence[str | os.PathLike[str]], rank: int | None) -> Path:
    """The log of ``rank`` (default: rank 0) among the logs of one run."""
    readers = open_ranks(paths)
    if rank is None:
        return readers[0].path
    for reader in readers:
        if reader.header.rank == rank:
            return reader.path
    have = ", ".join(str(r.header.rank) for r in readers)
    raise HooktraceError(f"no log of rank {rank} among the logs given; their ranks: {have}")

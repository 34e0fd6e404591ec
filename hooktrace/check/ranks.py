"""The logs of one multi-process run (one per rank): find them, check that they belong together,
and find the first step and module where the ranks' execution diverges.

A rank that skips a branch, runs an extra module or sees other shapes is the usual cause of a DDP
hang or its "unused parameters" error. The logs are walked in lockstep one step at a time by the
alignment engine that ``diff`` uses too (``hooktrace.log.align``). Standard library only.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hooktrace.log.align import Event, Feed, Walk, lockstep, parting
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.log.words import plural


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


def open_ranks(paths: Sequence[str | os.PathLike[str]]) -> list[LogReader]:
    """Readers for the logs, sorted by rank; several must be the ranks of one run."""
    readers = [LogReader(p) for p in expand(paths)]
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


@dataclass
class Divergence:
    step: int
    position: int  # index of the first differing event within the step
    model: str
    module: str
    ranks: dict[int, str]  # rank -> what it ran there ("nothing" past its last event)
    kind: str = "ran"  # ran | shapes | dtypes | steps (a rank recorded fewer or other steps)


def _describe(e: Event, kind: str) -> str:
    if e.phase == "backward":
        shapes = f"grad_output {e.outs} -> grad_input {e.ins}"
    elif kind == "dtypes":
        shapes = f"[{', '.join(e.in_dtypes)}] -> [{', '.join(e.out_dtypes)}]"
    else:
        shapes = f"{e.ins} -> {e.outs}"
    return f"{e.describe()} in {e.model} ({shapes})"


def first_divergence(readers: Sequence[LogReader], feeds: Sequence[Feed] | None = None
                     ) -> Divergence | None:
    """The first step and event where some rank's recorded execution differs from rank 0's, as
    ``diff`` decides it (``align.parting``). A step a rank was cut off in (a hang, a kill) is
    compared up to where that rank stopped, and is the last one compared. ``feeds``, one per
    log, are given every item of their log (``align.Walk``): all of it, also past the step
    where the ranks part."""
    no_feeds: list[Feed | None] = [None] * len(readers)
    walks = [Walk(r, f) for r, f in zip(readers, feeds or no_feeds, strict=True)]
    found = _first_divergence(walks, [r.header.rank for r in readers])
    for walk in walks:
        walk.drain()
    return found


def _first_divergence(walks: Sequence[Walk], ranks: list[int]) -> Divergence | None:
    if len(walks) < 2:
        return None
    for step, here in lockstep(walks, keep=lambda s: bool(s.events)):
        if any(s is None for s in here):  # a rank recorded fewer or other steps
            return Divergence(step, 0, "", "", {
                rank: plural(len(s.events), "event") if s is not None else "no events"
                for rank, s in zip(ranks, here, strict=True)}, "steps")
        per_rank = [s.events for s in here if s is not None]
        cut_off = any(s is not None and s.cut_off for s in here)
        if cut_off:
            shortest = min(len(events) for events in per_rank)
            per_rank = [events[:shortest] for events in per_rank]
        partings = [parting(per_rank[0], events) for events in per_rank[1:]]
        found = [(p.position, odd, p.kind) for odd, p in enumerate(partings, 1) if p is not None]
        if found:
            i, odd, kind = min(found)
            at = [events[i] if i < len(events) else None for events in per_rank]
            named = at[odd] or at[0]  # the module the odd rank ran, else rank 0's
            assert named is not None
            return Divergence(step, i, named.model, named.name, {
                rank: _describe(e, kind) if e is not None else "nothing (its step ended)"
                for rank, e in zip(ranks, at, strict=True)}, kind)
        if cut_off:
            return None
    return None

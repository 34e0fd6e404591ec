"""The logs of one multi-process run (one per rank, opened by ``hooktrace.log.discovery``): the
first step and module where the ranks' execution diverges.

A rank that skips a branch, runs an extra module or sees other shapes is the usual cause of a DDP
hang or its "unused parameters" error. The logs are walked in lockstep one step at a time by the
alignment engine that ``diff`` uses too (``hooktrace.log.align``). Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hooktrace.log.align import Event, Feed, Walk, lockstep, parting
from hooktrace.log.reader import LogReader
from hooktrace.log.words import plural


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
            return Divergence(step, i, named.model, named.fqn, {
                rank: _describe(e, kind) if e is not None else "nothing (its step ended)"
                for rank, e in zip(ranks, at, strict=True)}, kind)
        if cut_off:
            return None
    return None

"""The logs of one multi-process run (one per rank): find them, check that they belong together,
and find the first step and module where the ranks' execution diverges.

A rank that skips a branch, runs an extra module or sees other shapes is the usual cause of a DDP
hang or its "unused parameters" error. The logs are walked in lockstep one step at a time, so
memory holds one step per rank, whatever the length of the run. Standard library only.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooktrace import schema
from hooktrace.errors import HooktraceError
from hooktrace.logio import LogReader

Signature = tuple[Any, ...]  # what must agree between ranks for one event


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


def _steps(reader: LogReader) -> Iterator[tuple[int, list[tuple[Signature, str]]]]:
    """(step, the step's events as (signature, description)) in file order."""
    models: dict[int, str] = {}
    step: int | None = None
    current: list[tuple[Signature, str]] = []
    for r in reader:
        if isinstance(r, schema.Model):
            models[r.model] = r.name
        elif isinstance(r, (schema.ForwardEvent, schema.BackwardEvent)):
            if step is not None and r.step != step:
                yield step, current
                current = []
            step = r.step
            model = models.get(r.model, str(r.model))
            if isinstance(r, schema.ForwardEvent):
                signature: Signature = ("forward", model, r.name, r.call,
                                        str(r.input_shapes), str(r.output_shapes))
                shapes = f"{r.input_shapes} -> {r.output_shapes}"
            else:
                signature = ("backward", model, r.name, r.call, str(r.grad_output_shapes))
                shapes = f"grad {r.grad_output_shapes}"
            current.append((signature, f"{r.phase} of {r.name or '(root)'} call {r.call} "
                                       f"in {model} ({shapes})"))
    if step is not None:
        yield step, current


@dataclass
class Divergence:
    step: int
    position: int  # index of the first differing event within the step
    model: str
    module: str
    ranks: dict[int, str]  # rank -> what it ran there ("nothing" past its last event)


def first_divergence(readers: Sequence[LogReader]) -> Divergence | None:
    """The first step and event where some rank's recorded execution differs from rank 0's."""
    if len(readers) < 2:
        return None
    walks = [_steps(r) for r in readers]
    ranks = [r.header.rank for r in readers]
    while True:
        steps = [next(w, None) for w in walks]
        if all(s is None for s in steps):
            return None
        numbers = {s[0] for s in steps if s is not None}
        if None in steps or len(numbers) > 1:  # a rank recorded fewer or other steps
            step = min(numbers)
            return Divergence(step, 0, "", "", {
                rank: f"{len(s[1])} events" if s is not None and s[0] == step else "no events"
                for rank, s in zip(ranks, steps, strict=True)})
        found = _compare([s[1] for s in steps if s is not None], ranks, min(numbers))
        if found is not None:
            return found


def _compare(per_rank: list[list[tuple[Signature, str]]], ranks: list[int],
             step: int) -> Divergence | None:
    def at(events: list[tuple[Signature, str]], i: int) -> tuple[Signature, str] | None:
        return events[i] if i < len(events) else None

    for i in range(max(len(events) for events in per_rank)):
        here = [at(events, i) for events in per_rank]
        base = here[0][0] if here[0] else None
        odd = next((e for e in here[1:] if (e[0] if e else None) != base), "same")
        if odd == "same":
            continue
        named = odd if odd is not None else here[0]  # the module the odd rank ran, else rank 0's
        assert named is not None and not isinstance(named, str)
        return Divergence(step, i, str(named[0][1]), str(named[0][2]), {
            rank: e[1] if e else "nothing (its step ended)"
            for rank, e in zip(ranks, here, strict=True)})
    return None

"""The ``call-times`` signal read as typed rows: one ``CallTime`` per recorded call (``Signal``'s
docstring and docs/schema.md say what each field means). A log from before the signal, or a
step without it, has none: readers show no times there. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from hooktrace.log.signals import Signal, SignalKind


class CallTime(NamedTuple):
    """One call's times in microseconds (whole ones in the log); ``start`` and
    ``backward_start`` on the run's clock (the host's monotonic clock: comparable across the
    steps of one process)."""

    step: int
    model: int
    seq: int  # its forward event's
    start: float
    forward: float
    own: float  # the forward without its children's forwards
    backward_start: float | None  # None: no backward in its step
    backward: float | None


def _at(values: Any, i: int) -> float | None:
    value = values[i] if isinstance(values, list) and i < len(values) else None
    return float(value) if isinstance(value, (int, float)) else None


def call_times(signal: Signal) -> Iterator[CallTime]:
    """The calls of one ``call-times`` signal, in forward order; a malformed entry is skipped."""
    d = signal.detail
    origin, seqs = d.get("origin"), d.get("seq")
    if not isinstance(origin, (int, float)) or not isinstance(seqs, list):
        return
    for i, seq in enumerate(seqs):
        start, forward, own = _at(d.get("start"), i), _at(d.get("forward"), i), _at(d.get("own"), i)
        if not isinstance(seq, int) or start is None or forward is None or own is None:
            continue
        b_start, backward = _at(d.get("backward_start"), i), _at(d.get("backward"), i)
        yield CallTime(signal.step, signal.model, seq, origin + start, forward, own,
                       None if b_start is None else origin + b_start, backward)


def times_by_seq(records: Iterable[object]) -> dict[int, CallTime]:
    """Every call's times among ``records`` (any records of a log), by its forward seq."""
    found: dict[int, CallTime] = {}
    for r in records:
        if isinstance(r, Signal) and r.kind == SignalKind.CALL_TIMES:
            found.update((t.seq, t) for t in call_times(r))
    return found

"""Align logs step by step and find where their execution parts ways: the one engine behind
``check`` on the logs of several ranks and ``diff`` of two runs.

Each log is walked one step at a time (its events, parameter-gradient norms and anomalies), and
the logs are merged by step number, so memory holds one step per log, whatever the length of
the runs. Events are matched by model name, phase, module fqn and call index. Standard library
and orjson (through the reader) only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from hooktrace.log import schema
from hooktrace.log.decoder import (
    BackwardRow,
    BackwardRows,
    ForwardMore,
    ForwardRow,
    ForwardRows,
    Rows,
)
from hooktrace.log.names import LogNames
from hooktrace.log.reader import LogReader
from hooktrace.log.words import fqn_text

Shapes = Sequence[Any]  # shapes of a call's tensor leaves, as the reader gives them (lists)
Key = tuple[str, str, str, int]  # (model, phase, fqn, call): one call, in any run


class Event(NamedTuple):
    """One forward or backward event, with names resolved. For a backward event ``ins`` and
    ``outs`` are the shapes of grad_input and grad_output (None where no gradient flowed)."""

    model: str
    phase: str
    fqn: str
    call: int
    ins: Shapes
    outs: Shapes
    in_dtypes: Sequence[str]  # forward only
    out_dtypes: Sequence[str]
    in_stats: Sequence[schema.GradStat | None] | None  # backward with statistics only
    out_stats: Sequence[schema.GradStat | None] | None
    nonfinite: Sequence[Sequence[int]] | None  # forward: [output index, nan, inf]
    #: the class of the module that ran (its ``module`` record's: a module put in another's
    #: place, ``model[1] = nn.GELU()``, is named by a record of its own)
    cls: str = "?"

    @property
    def key(self) -> Key:
        return (self.model, self.phase, self.fqn, self.call)

    def describe(self) -> str:
        return f"{self.phase} of {fqn_text(self.fqn)} call {self.call}"


@dataclass
class StepRecords:
    """What one log recorded of one step."""

    step: int
    events: list[Event] = field(default_factory=list)
    params: dict[str, dict[str, float | None]] = field(default_factory=dict)  # model -> fqn
    anomalies: list[tuple[str, str, str, int]] = field(default_factory=list)  # kind, model,
    # fqn, call of each anomaly record (watched steps)
    cut_off: bool = False  # the log's last step, not closed: the run was cut off during it
    nonfinite: bool = False  # some event's output or gradient statistics hold NaN/Inf


@dataclass(frozen=True)
class ModuleInfo:
    cls: str
    params: int
    order: int  # position among its model's module records


Feed = Callable[[Rows | schema.Record], None]  # takes each item of a scan, in order


class Walk:
    """One log, read step by step. ``models`` and ``modules`` (model name -> fqn -> info) hold
    what the log has declared so far. ``feed`` is given every item the walk reads, and with
    ``drain`` what it did not, so that a reader that needs all of the log (``collect``) reads
    it in the same pass."""

    def __init__(self, reader: LogReader, feed: Feed | None = None) -> None:
        self.reader = reader
        self._feed = feed
        self._items: Iterator[Rows | schema.Record] | None = None  # the scan, once started
        self.names = LogNames()
        self.models = self.names.models  # model index -> name
        self.modules: dict[str, dict[str, ModuleInfo]] = {}
        self._names: dict[int, tuple[str, str, str]] = {}  # id -> (model name, fqn, class)
        self._closed = -1  # the last step a step record closed
        self.reached = -1  # the largest step it has read a record of: the run got that far

    def steps(self) -> Iterator[StepRecords]:
        """The log's steps in file order: each run of consecutive records of one step (events,
        parameter-gradient norms, anomalies)."""
        current = StepRecords(-1)  # steps count from 0: this one is never yielded
        reader, feed = self.reader, self._feed
        self._items = reader.scan(flow=reader.flow)  # as iterating the reader would
        for item in self._items:
            if feed is not None:
                feed(item)
            if isinstance(item, (ForwardRows, BackwardRows)):  # most of a log
                events = list(map(self._forward, item)) if isinstance(item, ForwardRows) \
                    else list(map(self._backward, item))
                nonfinite = any(map(_MORE, item)) and any(map(_nonfinite, item))
                if item[0][1] == item[-1][1] == current.step:  # [1]: a row's step
                    current.events += events
                    current.nonfinite = current.nonfinite or nonfinite
                    continue
                rows: Sequence[tuple[Any, ...]] = item
                for row, event in zip(rows, events, strict=True):
                    if row[1] != current.step:
                        if current.step >= 0:
                            yield current
                        current = self._begin(row[1])
                    current.events.append(event)
                    current.nonfinite = current.nonfinite or (nonfinite and _nonfinite(row))
            elif isinstance(item, (schema.ParamGrads, schema.Anomaly)):
                if item.step != current.step:
                    if current.step >= 0:
                        yield current
                    current = self._begin(item.step)
                if isinstance(item, schema.ParamGrads):
                    current.params[self._model(item.model)] = item.grad_norm
                else:
                    current.anomalies.append((item.kind, self._model(item.model), item.fqn,
                                              item.call))
            else:
                self._declare(item)
        if current.step >= 0:
            # no end record and no step record after its events: the run stopped inside it
            current.cut_off = reader.end is None and self._closed < current.step
            yield current

    def drain(self) -> None:
        """Give ``feed`` the items of the log that ``steps`` has not read (none were read if it
        never started); ``steps`` is not taken up again after."""
        if self._feed is not None:
            for item in self._items if self._items is not None else self.reader.scan(
                    flow=self.reader.flow):
                self._feed(item)
        self._items = iter(())

    def _begin(self, step: int) -> StepRecords:
        self.reached = max(self.reached, step)
        return StepRecords(step)

    def _model(self, index: int) -> str:
        return self.models.get(index, str(index))

    def _declare(self, record: schema.Record | None) -> None:
        if isinstance(record, schema.Step):
            self._closed = record.step
        elif isinstance(record, schema.Model):
            self.names.take(record)
        elif isinstance(record, schema.Module):
            self.names.take(record)
            known = self.modules.setdefault(self._model(record.model), {})
            known.setdefault(record.fqn, ModuleInfo(record.cls, record.params, len(known)))

    def _name(self, module: int) -> tuple[str, str, str]:
        """(model name, fqn, class) of a module id, kept from the first event that names it
        (its record came before it)."""
        found = self._names.get(module)
        if found is None:
            model, fqn = self.reader.modules[module]
            found = self._names[module] = (self._model(model), fqn,
                                           self.names.classes.get((model, fqn), "?"))
        return found

    # Most of a log: built with few lookups, as tuples (no keyword parsing)
    def _forward(self, row: ForwardRow) -> Event:
        _, _, module, call, (ins, in_types), (outs, out_types), more = row
        model, fqn, cls = self._names.get(module) or self._name(module)
        return tuple.__new__(Event, (model, "forward", fqn, call, ins, outs, in_types,
                                     out_types, None, None, more and more.output_nonfinite, cls))

    def _backward(self, row: BackwardRow) -> Event:
        _, _, module, call, _, grad_ins, grad_outs, in_stats, out_stats, _ = row
        model, fqn, cls = self._names.get(module) or self._name(module)
        return tuple.__new__(Event, (model, "backward", fqn, call, grad_ins, grad_outs, (), (),
                                     in_stats, out_stats, None, cls))


_MORE = itemgetter(-1)  # a row's ``more``: None for most events


def _nonfinite(row: tuple[Any, ...]) -> bool:
    """NaN/Inf in an event (a row without ``more`` has none)."""
    more = row[-1]
    if more is None:
        return False
    if isinstance(more, ForwardMore):
        return bool(more.output_nonfinite)
    stats = row[7:9]  # in_stats, out_stats of a backward row
    return any(s is not None and (len(s) != 2 or not math.isfinite(s[0]))
               for some in stats if some for s in some)


def lockstep(walks: Sequence[Walk], keep: Callable[[StepRecords], bool] = lambda s: True
             ) -> Iterator[tuple[int, list[StepRecords | None]]]:
    """(step, each log's records of it, None where a log has no such step), steps ascending;
    ``keep`` drops steps before they are merged."""
    streams = [(s for s in w.steps() if keep(s)) for w in walks]
    heads = [next(s, None) for s in streams]
    while any(h is not None for h in heads):
        step = min(h.step for h in heads if h is not None)
        here = [h if h is not None and h.step == step else None for h in heads]
        yield step, here
        heads = [next(stream, None) if mine is not None else head
                 for stream, mine, head in zip(streams, here, heads, strict=True)]


#: What two runs, or two ranks, must agree on for one call (an ``Event``'s fields): which call
#: it is (model, phase, fqn, call index) of which class, its shapes and its dtypes
signature = itemgetter(0, 1, 2, 3, 4, 5, 6, 7, 11)
_RAN = itemgetter(0, 1, 2, 3, 11)  # what ran: which call it is, of which class


@dataclass(frozen=True)
class Parting:
    """Where the events of one step first part ways between two logs A and B."""

    ran: int | None  # the first position whose call differs (a shorter step differs past its end)
    shapes: tuple[int, Event, Event] | None  # the first call both made, in A's order, whose
    # shapes or dtypes differ: its position in A, A's event, B's

    @property
    def position(self) -> int:
        """The first position where the logs differ in any way."""
        found = [i for i in (self.ran, self.shapes[0] if self.shapes else None) if i is not None]
        return min(found)

    @property
    def kind(self) -> str:
        """ran | shapes | dtypes: what differs first."""
        if self.shapes is None or (self.ran is not None and self.ran < self.shapes[0]):
            return "ran"
        a, b = self.shapes[1:]
        return "shapes" if (a.ins, a.outs) != (b.ins, b.outs) else "dtypes"


def parting(a: Sequence[Event], b: Sequence[Event]) -> Parting | None:
    """Where the events ``a`` and ``b`` of one step first part ways; None when they agree in
    what ran, shapes and dtypes (their numbers are not looked at)."""
    if list(map(signature, a)) == list(map(signature, b)):
        return None
    ran = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if _RAN(x) != _RAN(y)),
               None if len(a) == len(b) else min(len(a), len(b)))
    if ran is None:  # the same calls in the same order
        pairs: Iterator[tuple[int, Event, Event | None]] = (
            (i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)))
    else:
        by_key = {e[:4]: e for e in b}
        pairs = ((i, x, by_key.get(x[:4])) for i, x in enumerate(a))
    shapes = next(((i, x, y) for i, x, y in pairs if y is not None and x[4:8] != y[4:8]), None)
    return Parting(ran, shapes)


def renames(a: dict[str, ModuleInfo], b: dict[str, ModuleInfo]) -> dict[str, str]:
    """B's fqn -> A's for modules of one model that each log has under a name the other lacks,
    paired in declaration order when their class and parameter count agree."""
    only_a = sorted((n for n in a if n not in b), key=lambda n: a[n].order)
    only_b = sorted((n for n in b if n not in a), key=lambda n: b[n].order)
    mapping: dict[str, str] = {}
    for name_b in only_b:
        for name_a in only_a:
            if (a[name_a].cls, a[name_a].params) == (b[name_b].cls, b[name_b].params):
                mapping[name_b] = name_a
                only_a.remove(name_a)
                break
    return mapping

"""Loading one step of a log for a picture: ``load_step`` reads the log once and keeps the
events of one step (by default the first whose calls have a backward event) of the chosen
models; the steps it will not draw are *skimmed* (``hooktrace.log.decoder``), as
``StepChooser.may_draw`` says. Standard library only: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.log import schema
from hooktrace.log.align import Feed
from hooktrace.log.decoder import BackwardRows, ForwardRows
from hooktrace.log.errors import HooktraceError, LogError
from hooktrace.log.names import LogNames
from hooktrace.log.reader import LogReader
from hooktrace.log.words import plural, printable, ranges
from hooktrace.log.writer import capture_dir

StepEvent = schema.ForwardEvent | schema.BackwardEvent
ModuleKey = tuple[int, str]  # (model, fqn)


class SelectionError(HooktraceError):
    """``--step`` or ``--model`` names something the log does not hold."""


@dataclass(slots=True)
class StepLog:
    """What ``load_step`` kept: one step's events of the chosen models, and the module records."""

    path: Path
    step: int
    steps: list[int]  # every step of the chosen models that has events
    models: dict[int, str]  # model index -> name, from the ``model`` records
    classes: dict[ModuleKey, str]  # from the ``module`` records
    events: list[StepEvent]  # this step's, in seq order
    warnings: list[str] = field(default_factory=list)
    # forward seq -> step of its backward, for calls whose backward ran in a later step (a GAN's
    # generator: its forward in the discriminator's step, its backward in the next)
    later: dict[int, int] = field(default_factory=dict)
    captured: str | None = None  # "<folder> (N files)" when the run used --capture
    sources: dict[str, str] = field(default_factory=dict)  # class -> "file:line" of forward
    # the step's zoomed calls (``--ops``), by (model, fqn, call)
    ops: dict[tuple[int, str, int], schema.Ops] = field(default_factory=dict)

    @property
    def has_backward(self) -> bool:
        return any(e.phase == "backward" for e in self.events)

    def cls(self, model: int, fqn: str) -> str:
        return self.classes.get((model, fqn), "?")

    def names(self, models: Collection[int], unnamed: str = "") -> str:
        """``mnist (Net), critic (Critic)``: the models, with their root's class."""
        return ", ".join(f"{printable(self.models.get(m, f'{unnamed}{m}'))} "
                         f"({printable(self.cls(m, ''))})" for m in sorted(models))

    def heading(self) -> str:
        """The start of the first line of ``show``'s tables."""
        return f"step {self.step} (steps in the log: {ranges(self.steps)}): "


def without_data_models(events: list[StepEvent], names: LogNames) -> list[StepEvent]:
    """``events``, one step's, without those of the models that prepare data in that step
    (``LogNames.data_models`` over the models they name and those of their backward events).
    They stay in the log, and are drawn where nothing else ran."""
    data = names.data_models({e.model for e in events},
                             {e.model for e in events if e.phase == "backward"})
    return [e for e in events if e.model not in data] if data else events


class StepChooser:
    """Chooses the step to draw: the requested one, or the first whose calls have a backward
    event; keeps its events as they are read."""

    def __init__(self, step: int | None) -> None:
        self.step = step
        self.kept: dict[int, list[StepEvent]] = {}
        self.steps: set[int] = set()
        self.first_backward: int | None = None

    def may_draw(self, step: int) -> bool:
        """Whether ``step`` may still be the one drawn (the reader's step filter): the answer
        only narrows as the log is read."""
        if self.step is not None:
            return step == self.step
        return self.first_backward is None or step <= self.first_backward

    def target(self, step: int, backward: bool) -> list[StepEvent] | None:
        """The list to keep an event of ``step`` in, or None. Only a backward event of an
        earlier step than the first seen with one changes the answer for the events after it."""
        self.steps.add(step)
        if self.step is not None:
            return self.kept.setdefault(step, []) if step == self.step else None
        if backward and (self.first_backward is None or step < self.first_backward):
            self.first_backward = step
            self.kept = {step: self.kept.get(step, [])}  # earlier steps had no backward
        if self.first_backward is None or step == self.first_backward:
            # until a backward shows up every step is a candidate; that is one step in practice
            return self.kept.setdefault(step, [])
        return None

    def backward_of_earlier_call(self, fwd: int) -> None:
        """A backward event of the chosen models whose forward (seq ``fwd``) ran in an earlier
        step (a GAN's generator, called in the discriminator's step): when it is the first
        backward seen, the step drawn is the forward's, where the call is."""
        if self.step is not None or self.first_backward is not None:
            return
        for step, events in self.kept.items():
            if any(e.seq == fwd for e in events):
                self.first_backward, self.kept = step, {step: events}
                return

    def chosen(self) -> int:
        if self.step is not None:
            return self.step
        return self.first_backward if self.first_backward is not None else min(self.steps)


class FirstSteps(StepChooser):
    """Keeps the first ``count`` steps by number (those the view page draws), from every step
    read in full: a step smaller than the last of those kept takes its place, so that memory
    holds ``count`` steps, whatever the order of the log."""

    def __init__(self, count: int) -> None:
        super().__init__(None)
        self.count = count

    def may_draw(self, step: int) -> bool:
        return step in self.kept or len(self.kept) < self.count or step < max(self.kept)

    def backward_of_earlier_call(self, fwd: int) -> None:
        pass  # the steps are chosen by number

    def target(self, step: int, backward: bool) -> list[StepEvent] | None:
        self.steps.add(step)
        found = self.kept.get(step)
        if found is None and self.may_draw(step):
            if len(self.kept) == self.count:
                del self.kept[max(self.kept)]
            found = self.kept[step] = []
        return found


class StepKeeper:
    """What a pass over the log keeps of the steps its ``chooser`` may draw: ``take`` is given
    each item of a scan, in order (``load_step``'s pass, or the view page's ``Gatherer``'s);
    ``step_logs`` then gives them. ``model``: that model's events only. ``names``: the table of
    a reader that takes the same items, which fills it; by default the keeper fills its own."""

    def __init__(self, reader: LogReader, chooser: StepChooser, model: str | None = None,
                 names: LogNames | None = None) -> None:
        self.reader, self.chooser, self.model = reader, chooser, model
        self._fills_names = names is None
        self.names = LogNames() if names is None else names
        self.models = self.names.models
        self.any_events = False
        self.step_starts: dict[int, int] = {}  # step -> its first seq
        self.later: dict[int, int] = {}
        self.ops: dict[int, dict[tuple[int, str, int], schema.Ops]] = {}  # by step
        self._step: int | None = None  # of the last event, and its step's first seq:
        self._start = 0

    def take(self, item: ForwardRows | BackwardRows | schema.Record) -> None:
        """One item of the scan: rows of one type, or a record (of a scan that reads the data
        flow, ``flow=True``, for pictures that draw it)."""
        if isinstance(item, ForwardRows):
            self._rows(item, self.reader.forward_event, False)
        elif isinstance(item, BackwardRows):
            self._rows(item, self.reader.backward_event, True)
        else:
            if self._fills_names:
                self.names.take(item)
            if type(item) is schema.Ops and self.chooser.may_draw(item.step):
                self.ops.setdefault(item.step, {}).setdefault(
                    (item.model, item.fqn, item.call), item)

    def step_logs(self, model: str | None, steps: Collection[int]) -> dict[int, StepLog]:
        """A ``StepLog`` of each step kept that ``model`` ran (None: all models), by step;
        ``steps``: every step of ``model`` that has events (what the pass kept of every model
        does not say). Raises LogError / SelectionError as ``load_step`` does."""
        assert self.model in (None, model), "a pass that kept one model's events gives only it"
        self._check(model, steps)
        return {step: _step_log(self, step, model, steps) for step in sorted(self.chooser.kept)
                if step in steps}

    def _check(self, model: str | None, steps: Collection[int]) -> None:
        """LogError for a log without events; SelectionError for no ``model`` or no ``steps``."""
        models, path = self.models, self.reader.path
        if not self.any_events:
            raise LogError(f"{path} has no events: no module call was recorded")
        if model is not None and model not in models.values():
            names = ", ".join(repr(n) for n in sorted(models.values()))
            raise SelectionError(f"no model {model!r} in {path}; its models: {names}")
        if not steps:
            raise SelectionError(f"model {model!r} has no events in {path}")

    def _rows(self, rows: Sequence[Any], event: Callable[[Any], StepEvent], backward: bool
              ) -> None:
        """Rows of one type, in a loop that does little for the steps not kept: nearly all of
        them (skimmed: read for their seq, step, module and, backward, fwd only)."""
        self.any_events = True
        model, models, modules = self.model, self.models, self.reader.modules
        run: int | None = None  # the step of the events kept in target
        target: list[StepEvent] | None = None
        for row in rows:
            seq, step, module = row[0], row[1], row[2]
            if step != self._step:
                self._step, self._start = step, self.step_starts.setdefault(step, seq)
            earlier = backward and row[4] < self._start  # the backward of an earlier call
            if earlier:
                self.later[row[4]] = step
            if model is not None and models.get(modules[module][0]) != model:
                continue
            if earlier:
                self.chooser.backward_of_earlier_call(row[4])
            if step != run:
                run, target = step, self.chooser.target(step, backward)
            if target is not None:
                target.append(event(row))


def load_step(path: str | os.PathLike[str] | LogReader, step: int | None = None,
              model: str | None = None, feed: Feed | None = None) -> StepLog:
    """Stream the log at ``path`` and keep step ``step`` (default: the first whose calls have a
    backward event, the step of their forward) of the model named ``model`` (default: all).
    ``feed``: hand every item of the pass on to another reader too (check's ``Collector``).
    Raises LogError / SelectionError."""
    reader = path if isinstance(path, LogReader) else LogReader(path)
    loaded = StepKeeper(reader, StepChooser(step), model)
    for item in reader.scan(steps=None if feed else loaded.chooser.may_draw, flow=True):
        if feed is not None:  # it reads every step in full: none is skimmed
            feed(item)
        loaded.take(item)
    loaded._check(model, loaded.chooser.steps)
    chosen = loaded.chooser.chosen()
    if chosen not in loaded.chooser.steps:
        raise SelectionError(f"no step {chosen} in {loaded.reader.path}; its steps: "
                             f"{ranges(sorted(loaded.chooser.steps))}")
    return _step_log(loaded, chosen, model, loaded.chooser.steps)


def _step_log(loaded: StepKeeper, chosen: int, model: str | None,
              steps: Collection[int]) -> StepLog:
    reader, chooser, models = loaded.reader, loaded.chooser, loaded.models
    events = sorted(chooser.kept.get(chosen, []), key=lambda e: e.seq)
    if model is None:
        events = without_data_models(events, loaded.names)
    elif loaded.model is None:  # the pass kept every model's events: this one's
        events = [e for e in events if models.get(e.model) == model]
    forward = {e.seq for e in events if isinstance(e, schema.ForwardEvent)}
    earlier = {models.get(e.model, str(e.model)) for e in events
               if isinstance(e, schema.BackwardEvent) and e.fwd not in forward}
    warnings = list(reader.warnings)
    if earlier:
        warnings.append(f"step {chosen} also runs the backward of calls made in an earlier step "
                        f"(model {', '.join(sorted(earlier))}); they are drawn in that step")
    captured = (f"{capture_dir(reader.path)} ({plural(reader.end.captured, 'file')})"
                if reader.end is not None and reader.end.captured else None)
    return StepLog(reader.path, chosen, sorted(steps), models, loaded.names.classes, events,
                   warnings, {f: s for f, s in loaded.later.items() if f in forward}, captured,
                   loaded.names.sources, loaded.ops.get(chosen, {}))

"""What ``hooktrace view`` shows of one log, gathered in one streaming pass: the modules in
forward order, and per module and step the gradient's size and health (the heatmap's cells),
the parameter-gradient norms, the watched steps' anomaly records, and the events of the steps
whose call graphs the page draws. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hooktrace.log import schema
from hooktrace.log.align import Feed
from hooktrace.log.decoder import BackwardRows, ForwardRows
from hooktrace.log.gradstat import norm, worst
from hooktrace.log.names import LogNames, ancestors
from hooktrace.log.options import TraceOptions
from hooktrace.log.reader import LogReader
from hooktrace.show.calls import depth_of
from hooktrace.show.steplog import FirstSteps, ModuleKey, StepKeeper, StepLog

MAX_STEPS = 200  # heatmap columns: a longer run shows every n-th recorded step
MAX_GRAPH_STEPS = 20  # steps drawn per rank and model: the first ones recorded


@dataclass(slots=True)
class Cell:
    """One module in one step: its calls and what their backward brought."""

    calls: int = 0  # forward calls with gradients on
    no_grad: int = 0  # forward calls with gradients off
    backward: int = 0  # backward events
    grad_norm: float | None = None  # the largest grad_output norm of its calls (NaN/Inf wins)
    grad_nan: int = 0  # NaN / Inf elements in its gradients (both sides)
    grad_inf: int = 0
    output_nan: int = 0  # NaN / Inf elements in its forward outputs
    output_inf: int = 0
    param_norm: float | None = None  # its own parameters' gradient norm (params record)
    params_seen: bool = False  # the params record named it (a None norm: no gradient)


@dataclass(slots=True)
class RunData:
    """One rank's log, as the page and the heatmap need it."""

    path: str
    rank: int
    header: schema.Header
    names: LogNames = field(default_factory=LogNames)  # each model's name, each module's class
    first_seq: dict[ModuleKey, int] = field(default_factory=dict)  # first forward's seq
    cells: dict[tuple[int, str, int], Cell] = field(default_factory=dict)  # (model, fqn, step)
    steps: set[int] = field(default_factory=set)  # steps with events
    anomalies: list[schema.Anomaly] = field(default_factory=list)
    end: schema.End | None = None
    warnings: list[str] = field(default_factory=list)
    stats: bool = True
    reached: set[int] = field(default_factory=set)  # models a backward event names
    model_steps: dict[int, set[int]] = field(default_factory=dict)  # model -> steps with events
    drawn: StepKeeper | None = None  # the events of the steps the call graphs draw

    @property
    def models(self) -> dict[int, str]:
        return self.names.models

    @property
    def classes(self) -> dict[ModuleKey, str]:
        return self.names.classes

    def data_models(self) -> set[int]:
        """The models that prepare data in the whole log (``LogNames.data_models``)."""
        return self.names.data_models({model for model, _ in self.first_seq}, self.reached)

    def model_names(self) -> list[str]:
        """The names of the models the page offers to choose (not ``data_models``), sorted."""
        data = self.data_models()
        return sorted(name for model, name in self.models.items() if model not in data)

    def step_logs(self, model: str | None) -> dict[int, StepLog]:
        """The steps the call graphs draw that the model named ``model`` ran (None: all
        models), by step. Raises LogError / SelectionError as ``steplog.load_step`` does."""
        assert self.drawn is not None, "gathered without the steps to draw"
        if model is None:
            return self.drawn.step_logs(None, self.steps)
        steps = {step for index, name in self.models.items() if name == model
                 for step in self.model_steps.get(index, ())}
        return self.drawn.step_logs(model, steps)

    def cell(self, model: int, fqn: str, step: int) -> Cell:
        key = (model, fqn, step)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = Cell()
        return found

    def rows(self) -> list[ModuleKey]:
        """Every module that ran, in forward order: a module before the modules inside it
        (forward events are written on return, children first: a module starts with its first
        descendant); not those of models that prepare data (``data_models``)."""
        data = self.data_models()
        start = {key: seq for key, seq in self.first_seq.items() if key[0] not in data}
        for (model, fqn), seq in self.first_seq.items():
            for above in ancestors(fqn):
                key = (model, above)
                if key in start and seq < start[key]:
                    start[key] = seq
        return sorted(start, key=lambda k: (start[k], depth_of(k[1]), k))

    def columns(self) -> list[int]:
        """The heatmap's steps: the recorded ones (every n-th past MAX_STEPS) and the watched
        steps with anomaly records."""
        recorded = sorted(self.steps)
        if len(recorded) > MAX_STEPS:
            every = math.ceil(len(recorded) / MAX_STEPS)
            recorded = recorded[::every]
        return sorted({*recorded, *(a.step for a in self.anomalies)})


def _record(data: RunData, r: Any) -> None:
    if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent)):
        data.steps.add(r.step)
        data.model_steps.setdefault(r.model, set()).add(r.step)
        cell = data.cell(r.model, r.fqn, r.step)
        if isinstance(r, schema.BackwardEvent):
            data.reached.add(r.model)
            cell.backward += 1
            if (grad := norm(r.grad_output_stats)) is not None:  # the largest; NaN/Inf stays
                cell.grad_norm = worst([grad] if cell.grad_norm is None else [cell.grad_norm, grad])
            for stat in [*(r.grad_output_stats or ()), *(r.grad_input_stats or ())]:
                if stat is not None and len(stat) == 4:  # NaN/Inf counts: the norm is not finite
                    cell.grad_nan += int(stat[2])
                    cell.grad_inf += int(stat[3])
            return
        data.first_seq.setdefault((r.model, r.fqn), r.seq)
        if r.no_grad:
            cell.no_grad += 1
        elif not r.recompute:
            cell.calls += 1
        for _, nan, inf in r.output_nonfinite or []:
            cell.output_nan += nan
            cell.output_inf += inf
    elif isinstance(r, schema.ParamGrads):
        for fqn, value in r.grad_norm.items():
            cell = data.cell(r.model, fqn, r.step)
            cell.param_norm, cell.params_seen = value, True
    elif isinstance(r, schema.Anomaly):
        data.anomalies.append(r)
    else:
        data.names.take(r)


class Gatherer:
    """Takes the items of one ``LogReader.scan`` (``take``), in order, like check's
    ``Collector``: fed by another reader's pass (the walk across the ranks' logs) or by
    ``gather``'s; ``finish`` gives the log's ``RunData``. ``draw``: keep the events of the first
    ``draw`` steps for the call graphs (``RunData.step_logs``; 0: none), which draw the data
    flow of a scan that reads it (``flow=True``)."""

    def __init__(self, reader: LogReader, draw: int = MAX_GRAPH_STEPS) -> None:
        self.reader = reader
        self.data = RunData(str(reader.path), reader.header.rank, reader.header,
                            stats=TraceOptions.from_header(reader.header).stats)
        # the keeper reads its names from the log's one table, which ``take`` fills
        self.keeper = StepKeeper(reader, FirstSteps(draw), names=self.data.names) \
            if draw else None

    def take(self, item: ForwardRows | BackwardRows | schema.Record) -> None:
        """One item of the scan: rows of one type, or a record."""
        data, reader = self.data, self.reader
        if self.keeper is not None:
            self.keeper.take(item)
        if isinstance(item, ForwardRows):
            for forward in map(reader.forward_event, item):
                _record(data, forward)
        elif isinstance(item, BackwardRows):
            for backward in map(reader.backward_event, item):
                _record(data, backward)
        else:
            _record(data, item)

    def finish(self) -> RunData:
        data = self.data
        data.end = self.reader.end
        data.warnings = list(self.reader.warnings)
        data.drawn = self.keeper
        return data


def gather(reader: LogReader, feed: Feed | None = None, draw: int = MAX_GRAPH_STEPS
           ) -> RunData:
    """One pass over the log of ``reader`` (with its data flow where it keeps steps to draw:
    ``Gatherer``); ``feed``: hand every item of the pass on to another reader too (check's
    ``Collector``)."""
    gatherer = Gatherer(reader, draw)
    for item in reader.scan(flow=reader.flow or draw > 0):  # as rows
        if feed is not None:
            feed(item)
        gatherer.take(item)
    return gatherer.finish()

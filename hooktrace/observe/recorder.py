"""The log writer observer: turns the recorded steps' calls into forward and backward events.

Events of a backward pass (and every event while statistics wait for the device) are held and
written in ``seq`` order when the pass ends, after their numbers are resolved; what other
observers ``emit`` at the step's end (parameter norms, anomalies) follows them, then the step
record. A watched step writes only what the others emit.
"""

from __future__ import annotations

from itertools import compress, repeat
from typing import Any, Protocol

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import BackwardStart, ForwardEnd, Mode, Observer, PassEnd
from hooktrace.hooks.tensors import shape_of, summarize
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.nanweights import nonfinite_params
from hooktrace.observe.outputs import OutputCheck
from hooktrace.observe.stats import TensorStats

_MAX_PENDING = 8192  # events held for deferred statistics before a forced write (no backward)


class Sink(Protocol):
    def write(self, record: Any) -> None: ...
    def flush(self) -> None: ...


class Facts(Protocol):
    """What the log writer tells the observer that chooses which modules to zoom into
    (``ops.OpsObserver``) of what it meets."""

    open: bool  # whether facts are wanted now: read before each is told

    def fact(self, model: int, name: str) -> None:
        """Something wrong at a module: a gradient lost, the first NaN/Inf output."""
        ...

    def written(self, events: list[schema.ForwardEvent | schema.BackwardEvent],
                unusual: bool) -> None:
        """Held events were written (``unusual``: their statistics met a gradient all zero or
        not finite)."""
        ...


class LogRecorder(Observer):
    """Writes the events of recorded steps, and every record to ``sink`` in order."""

    follows = (Mode.RECORDED,)

    def __init__(self, sink: Sink, stats: TensorStats | None, outputs: OutputCheck | None) -> None:
        self._sink = sink
        self._stats = stats
        self._outputs = outputs  # None without statistics
        self._pending: list[schema.ForwardEvent | schema.BackwardEvent] = []
        self._after: list[Any] = []  # emitted while events were held: written after them
        self._open: dict[int, schema.BackwardEvent] = {}  # this pass's backward events, by seq
        self._forwards = self._backwards = 0  # events of the current step
        # step -> forward seq -> the inputs of a recorded call that needed a gradient (bit i:
        # input i): those that get none by the end of the pass are the event's ``lost``. An
        # int, not a container: what lives until the backward is what the garbage collector
        # walks, and promotes
        self._needs: dict[int, dict[int, int]] = {}
        # the step's first call with NaN/Inf outputs has its weights looked at: until then,
        # while statistics wait for the device, the calls that may be it
        self._weights_looked = False
        self._suspects: list[tuple[schema.ForwardEvent, ModInfo]] = []
        self._after_event: list[schema.Signal] = []  # said of the event just made, after it
        # told what it meets that says which module to zoom into (the tracer connects the ops
        # observer), and the statistics' count of unusual gradients last seen
        self.facts: Facts | None = None
        self._unusual = 0

    def emit(self, record: Any) -> None:
        """Write another observer's record, after the events held so far."""
        if self._pending:
            self._after.append(record)
            return
        if self._stats is not None:
            self._stats.resolve()  # a parameter norm may wait for the device
        self._sink.write(record)

    def emit_now(self, record: schema.Model | schema.Module) -> None:
        """Write naming's record of a model or module at once: ahead of the events held so
        far, which may name it (``emit`` would write it after them), and without reading the
        statistics (a device sync)."""
        self._sink.write(record)

    def forward_end(self, end: ForwardEnd) -> None:
        stats = self._stats
        call = end.call
        start, info = end.start, call.info
        in_shapes, in_dtypes = start.input_summary
        if end.kw_inputs:
            kw_shapes, kw_dtypes = summarize(end.kw_inputs)
            in_shapes, in_dtypes = in_shapes + kw_shapes, in_dtypes + kw_dtypes
        out_shapes, out_dtypes = summarize(end.outputs)
        event = schema.ForwardEvent(
            call.seq, call.step, info.model, info.fqn, call.call_index, in_shapes, in_dtypes,
            out_shapes, out_dtypes, no_grad=not start.grad, recompute=call.recompute,
            eval_mode=not start.training,
            inputs_more=(start.inputs_more + end.kw_inputs_more) or None,
            outputs_more=end.outputs_more or None, inputs_from=end.inputs_from,
            made=end.made, from_out=end.from_out if any(map(any, end.from_out)) else None,
            made_out=end.made_out or None, made_no_history=end.made_no_history,
        )
        if self._outputs is not None:
            event.output_nonfinite = self._outputs.check(end.outputs)
            if not self._weights_looked:
                if event.output_nonfinite:
                    inputs = self._nonfinite_inputs(end)
                    found = self._look_at_weights(event, info)
                    if found is not None:
                        self._after_event.append(found)
                    if inputs:  # the NaN/Inf came in: not made by this call
                        self._after_event.append(schema.Signal(
                            event.step, event.model, event.fqn, SignalKind.NONFINITE_INPUTS,
                            {"inputs": inputs}))
                elif stats is not None and stats.deferred and len(self._suspects) < _MAX_PENDING:
                    self._suspects.append((event, info))  # known when the numbers are read
        if start.grad:
            # not an input the call changed in place while a view: autograd rebased its history
            # (CopySlices), and the node its gradient hook is on may never run
            versions = start.input_versions
            needs = 0
            for i, t in enumerate(start.inputs):
                if t.requires_grad and not (t._version != versions[i] and t._is_view()):
                    needs |= 1 << i
            if end.kw_inputs:
                for j, t in enumerate(end.kw_inputs, len(start.inputs)):
                    if t.requires_grad:
                        needs |= 1 << j
            if needs:
                of_step = self._needs.get(call.step)
                if of_step is None:
                    of_step = self._needs[call.step] = {}
                of_step[call.seq] = needs
        self._forwards += 1
        # inside backward, or while statistics wait for the device: held, written in seq order
        if end.in_backward or self._pending or (stats is not None and stats.deferred):
            self._pending.append(event)
            if len(self._pending) > _MAX_PENDING and not end.in_backward:
                self._raise(self._write_pending())  # forward-only code: no backward will come
        else:
            self._sink.write(event)
        if self._after_event:  # said of the event: after it
            for record in self._after_event:
                self.emit(record)
            self._after_event.clear()

    def backward_start(self, start: BackwardStart) -> None:
        if start.mode is not Mode.RECORDED:
            return
        call = start.call
        info = call.info
        n_in, n_out = call.n_in, call.n_out
        stats = self._stats is not None
        event = self._open[start.seq] = schema.BackwardEvent(
            start.seq, start.step, info.model, info.fqn, call.call_index, call.seq, n_in, n_out,
            [None] * n_in, [None] * n_out, call.recompute,
            [None] * n_in if stats else None, [None] * n_out if stats else None)
        self._pending.append(event)
        self._backwards += 1

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        event = self._open.get(start.seq)
        if event is None:
            return
        event.grad_output_shapes[index] = shape_of(grad)
        if event.grad_output_stats is not None and self._stats is not None:
            self._stats.grad(grad, event.grad_output_stats, index)

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        event = self._open.get(start.seq)
        if event is None:
            return
        event.grad_input_shapes[index] = shape_of(grad)
        if event.grad_input_stats is not None and self._stats is not None:
            self._stats.grad(grad, event.grad_input_stats, index)

    def backward_end(self, end: PassEnd) -> None:
        if self._stats is not None:
            self._stats.end_pass()
        self._mark_lost(end.step)
        error = self._write_pending()
        self._open.clear()  # written: let them go now, not when the graph is freed
        forward, backward = self._forwards, self._backwards
        if end.mode is Mode.RECORDED or forward or backward:  # also the step the cap cut short
            self._sink.write(schema.Step(end.step, forward, backward))
        self._sink.flush()
        self._forwards = self._backwards = 0
        self._weights_looked = False
        if self._outputs is not None:
            self._outputs.reset()
        self._raise(error)

    def _mark_lost(self, step: int) -> None:
        """The inputs of this pass's calls that needed a gradient and got none: the gradient
        stopped inside the call. Calls of older steps than the last are forgotten (forward-only
        code keeps none)."""
        needs = self._needs
        if needs:
            events = list(self._open.values())
            fwds = [event.fwd for event in events]
            for of_step in needs.values():  # this step's calls, or the last's (retain_graph)
                # a seq is in one step's only; popped: a second pass over the graph has none
                needed = list(map(of_step.pop, fwds, repeat(0)))
                for event, bits in compress(zip(events, needed, strict=True), needed):
                    if None in event.grad_input_shapes:  # else every input got its gradient
                        lost = [i for i, shape in enumerate(event.grad_input_shapes)
                                if shape is None and bits >> i & 1]
                        event.lost = lost or None
                        if lost and self.facts is not None and self.facts.open:
                            self.facts.fact(event.model, event.fqn)
        for old in [s for s in needs if s < step]:
            del needs[old]

    def stop(self, step: int, mode: Mode) -> None:
        error = None
        if self._pending or self._after:  # a backward that never finished (it raised)
            error = self._write_pending()
        self._sink.flush()
        self._raise(error)

    def _write_pending(self) -> Exception | None:
        """Write the held events in seq order, then what was emitted meanwhile; return the
        error of statistics that could not be read (the events go without them)."""
        pending, self._pending = self._pending, []
        error = None
        if self._stats is not None:
            try:
                self._stats.resolve()
            except Exception as e:
                error = e
        suspects, self._suspects = self._suspects, []
        for suspect, info in suspects:
            if suspect.output_nonfinite and not self._weights_looked:
                found = self._look_at_weights(suspect, info)
                if found is not None:
                    self._after.insert(0, found)  # after the events
        pending.sort(key=lambda e: e.seq)
        for event in pending:
            self._sink.write(event)
        if self.facts is not None and self.facts.open:
            unusual = self._stats is not None and self._stats.unusual != self._unusual
            if unusual and self._stats is not None:
                self._unusual = self._stats.unusual
            self.facts.written(pending, unusual)
        after, self._after = self._after, []
        for record in after:
            self._sink.write(record)
        return error

    def _nonfinite_inputs(self, end: ForwardEnd) -> list[list[int]]:
        """The step's first call with NaN/Inf outputs, found at once (on the host): its tensor
        inputs that held NaN/Inf too, [input index, nan, inf] each (args then kwargs); an input
        the call changed in place is not judged (it may be its output now). Nothing on a
        device, where the outputs are known only when the step's numbers are read."""
        stats = self._stats
        if stats is None or stats.deferred:
            return []
        found: list[list[int]] = []
        start = end.start
        versions = start.input_versions
        for i, t in enumerate(start.inputs):
            try:
                changed = i < len(versions) and t._version != versions[i]
            except RuntimeError:  # an inference-mode tensor has no version counter
                changed = False
            if not changed:
                stats.nonfinite(t, found, i)
        for j, t in enumerate(end.kw_inputs, len(start.inputs)):
            stats.nonfinite(t, found, j)
        return found

    def _look_at_weights(self, event: schema.ForwardEvent,
                         info: ModInfo) -> schema.Signal | None:
        """The step's first call with NaN/Inf outputs: a ``nonfinite-weights`` signal when its
        own weights hold NaN/Inf too (they did when it ran: nothing steps an optimizer inside
        a forward, nor before the step's numbers are read)."""
        self._weights_looked = True
        if self.facts is not None and self.facts.open:
            self.facts.fact(info.model, info.fqn)
        params = nonfinite_params(info.ref())
        if not params:
            return None
        return schema.Signal(event.step, event.model, event.fqn, SignalKind.NONFINITE_WEIGHTS,
                             {"params": list(params), "dtypes": sorted(set(params.values()))})

    @staticmethod
    def _raise(error: Exception | None) -> None:
        if error is not None:
            raise error

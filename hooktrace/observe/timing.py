"""How long each module call of a recorded step took: its forward, apart from its children's,
and its backward (a ``call-times`` signal per model and recorded step, keyed by forward ``seq``).

On the host's monotonic clock (``time.perf_counter_ns``), read when the core hands this observer a
call's start and end: two reads per call and one per backward, recorded steps only (a watched
step costs nothing here). What hooktrace's other observers do at a call's end (statistics, the
log writer) runs after this one's reading: it lands in the caller's own time, not the call's.
A call's backward runs from the first gradient reaching its outputs to the last gradient of its
inputs (a call whose inputs need none: to the pass's end). On a GPU these are the times the host
queued the work, not the device's: TODO(issue 46) CUDA events recorded per call and read once at
the pass's end (no synchronisation per call); no GPU here to test it on.
"""

from __future__ import annotations

import threading
import time

import torch

from hooktrace.hooks.records import (
    BackwardStart,
    Emit,
    ForwardEnd,
    ForwardStart,
    Mode,
    Observer,
    PassEnd,
)
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

_US = 1000.0  # the clock's nanoseconds per microsecond, the unit the signal is written in


class _Running(threading.local):
    def __init__(self) -> None:
        # calls running in this thread: [their start, their start's clock, children's time]
        self.stack: list[tuple[ForwardStart, int, list[int]]] = []


class CallTimes(Observer):
    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._running = _Running()
        self._origin = -1  # the clock at this step's first reading
        # this step's calls: (model, forward seq, start, total, own), clock nanoseconds
        self._calls: list[tuple[int, int, int, int, int]] = []
        self._backward: dict[int, list[int]] = {}  # forward seq -> [start, end or -1]

    def _now(self) -> int:
        now = time.perf_counter_ns()
        if self._origin < 0:
            self._origin = now
        return now

    def forward_start(self, start: ForwardStart) -> None:
        self._running.stack.append((start, self._now(), [0]))

    def forward_end(self, end: ForwardEnd) -> None:
        now = time.perf_counter_ns()
        stack = self._running.stack
        while stack and stack[-1][0] is not end.start:  # calls that raised
            stack.pop()
        if not stack:
            return
        _, began, children = stack.pop()
        total = now - began
        if stack:
            stack[-1][2][0] += total
        call = end.call
        self._calls.append((call.info.model, call.seq, began, total, total - children[0]))

    def backward_start(self, start: BackwardStart) -> None:
        self._backward[start.call.seq] = [self._now(), -1]

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        span = self._backward.get(start.call.seq)
        if span is not None:
            span[1] = time.perf_counter_ns()

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is Mode.RECORDED:
            self._write(end.step, time.perf_counter_ns())
        self._forget()

    def stop(self, step: int, mode: Mode) -> None:
        if mode is Mode.RECORDED:  # a step with no backward pass (inference) is timed too
            self._write(step, time.perf_counter_ns())
        self._forget()

    def _forget(self) -> None:
        self._origin = -1
        self._calls = []
        self._backward = {}
        self._running.stack.clear()

    def _write(self, step: int, ended: int) -> None:
        origin = self._origin
        if origin < 0:
            return
        models: dict[int, dict[str, list[float | None]]] = {}
        for model, seq, began, total, own in self._calls:
            columns = models.get(model)
            if columns is None:
                columns = models[model] = {k: [] for k in ("seq", "start", "forward", "own",
                                                           "backward_start", "backward")}
            span = self._backward.get(seq)
            columns["seq"].append(seq)
            columns["start"].append(round((began - origin) / _US, 1))
            columns["forward"].append(round(total / _US, 1))
            columns["own"].append(round(own / _US, 1))
            if span is None:
                columns["backward_start"].append(None)
                columns["backward"].append(None)
            else:
                stop = span[1] if span[1] >= 0 else ended
                columns["backward_start"].append(round((span[0] - origin) / _US, 1))
                columns["backward"].append(round((stop - span[0]) / _US, 1))
        for model, columns in sorted(models.items()):
            detail = {"origin": round(origin / _US, 1), "end": round((ended - origin) / _US, 1),
                      **columns}
            self._emit(schema.Signal(step, model, "", SignalKind.CALL_TIMES, detail))

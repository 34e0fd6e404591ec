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
from typing import Any

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

_clock = time.perf_counter_ns


class _Running(threading.local):
    def __init__(self) -> None:
        # calls running in this thread: [their start, the clock then, their children's time]
        self.stack: list[list[Any]] = []


def _us(ns: int) -> int:
    """Whole microseconds: a module call takes a few at least, and a short number keeps the
    signal near 30 bytes a call."""
    return (ns + 500) // 1000


class CallTimes(Observer):
    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._running = _Running()
        # this step's calls: (model, forward seq, start, total, own), clock nanoseconds
        self._calls: list[tuple[int, int, int, int, int]] = []
        self._backward: dict[int, list[int]] = {}  # forward seq -> [start, end or -1]

    def forward_start(self, start: ForwardStart) -> None:
        self._running.stack.append([start, _clock(), 0])

    def forward_end(self, end: ForwardEnd) -> None:
        now = _clock()
        stack = self._running.stack
        while stack and stack[-1][0] is not end.start:  # calls that raised
            stack.pop()
        if not stack:
            return
        _, began, children = stack.pop()
        total = now - began
        if stack:
            stack[-1][2] += total
        call = end.call
        self._calls.append((call.info.model, call.seq, began, total, total - children))

    def backward_start(self, start: BackwardStart) -> None:
        self._backward[start.call.seq] = [_clock(), -1]

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        span = self._backward.get(start.call.seq)
        if span is not None:
            span[1] = _clock()

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is Mode.RECORDED:
            self._write(end.step, _clock())
        self._forget()

    def stop(self, step: int, mode: Mode) -> None:
        if mode is Mode.RECORDED:  # a step with no backward pass (inference) is timed too
            self._write(step, _clock())
        self._forget()

    def _forget(self) -> None:
        self._calls = []
        self._backward = {}
        self._running.stack.clear()

    def _write(self, step: int, ended: int) -> None:
        if not self._calls:
            return
        origin = min(call[2] for call in self._calls)
        models: dict[int, list[tuple[int, int, int, int, int]]] = {}
        for call in self._calls:
            models.setdefault(call[0], []).append(call)
        for model, calls in sorted(models.items()):
            spans = [self._backward.get(call[1]) for call in calls]
            detail = {
                "origin": _us(origin), "end": _us(ended - origin),
                "seq": [call[1] for call in calls],
                "start": [_us(call[2] - origin) for call in calls],
                "forward": [_us(call[3]) for call in calls],
                "own": [_us(call[4]) for call in calls],
                "backward_start": [None if s is None else _us(s[0] - origin) for s in spans],
                "backward": [None if s is None else _us((s[1] if s[1] >= 0 else ended) - s[0])
                             for s in spans]}
            self._emit(schema.Signal(step, model, "", SignalKind.CALL_TIMES, detail))

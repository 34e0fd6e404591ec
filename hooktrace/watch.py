"""Watched steps: after the fully recorded steps, keep looking, write only what is wrong.

A 10,000-step run must not write gigabytes, yet a NaN that first appears at step 9,000 must still
be found with its module. In a watched step the core follows every call as usual but no event is
written; this observer checks outputs and gradients for NaN/Inf and, when the step ends, emits
``anomaly`` records: the first module whose output held NaN/Inf, the first NaN/Inf gradient, and
modules with trainable parameters that received gradient before but got none for their last
step's calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hooktrace import schema
from hooktrace.naming import ModInfo
from hooktrace.outputs import OutputCheck
from hooktrace.records import BackwardStart, ForwardCall, ForwardEnd, Mode, Observer, PassEnd
from hooktrace.stats import Stats

_MAX_HELD = 8192  # calls held per step; forward-only code (no backward, no step end) is bounded
WATCHED = Mode.WATCHED

_Numbers = list[tuple[float, ...] | None]


class Watch(Observer):
    follows = (WATCHED,)

    def __init__(self, stats: Stats, outputs: OutputCheck, emit: Callable[[Any], None]) -> None:
        self._stats = stats
        self._outputs = outputs
        self._emit = emit
        # NaN/Inf outputs of the step's calls (filled in when statistics are resolved)
        self._forward: list[tuple[ModInfo, int, list[list[int]]]] = []
        # the step's backward calls, in the order they began: (grad_input, grad_output) checks
        self._backward: dict[BackwardStart, tuple[_Numbers, _Numbers]] = {}
        # forward calls of modules with parameters, in order; those whose backward began
        self._calls: list[ForwardCall] = []
        self._waiting: set[ForwardCall] = set()
        self._got_backward: set[ForwardCall] = set()
        self._had_grad: set[ModInfo] = set()  # modules that received gradient at some step

    def forward_end(self, end: ForwardEnd) -> None:
        call = end.call
        found = self._outputs.check(end.outputs)
        if found or self._stats.deferred:  # else nothing to hold: all outputs were finite
            self._forward.append((call.info, call.call_index, found))
        if len(self._forward) > _MAX_HELD and not end.in_backward:
            self._stats.resolve()
            for anomaly in self._forward_anomalies(call.step):
                self._emit(anomaly)
        if end.start.grad and call.info.has_params:
            self._calls.append(call)
            self._waiting.add(call)

    def backward_start(self, start: BackwardStart) -> None:
        call = start.call
        self._had_grad.add(call.info)
        if call in self._waiting:
            self._got_backward.add(call)
        if start.mode is WATCHED:
            self._backward[start] = ([None] * call.n_in, [None] * call.n_out)

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        numbers = self._backward.get(start)
        if numbers is not None:
            self._stats.grad(grad, numbers[1], index, False)

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        numbers = self._backward.get(start)
        if numbers is not None:
            self._stats.grad(grad, numbers[0], index, False)

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is WATCHED:
            self._stats.end_pass()
            self._stats.resolve()
            for anomaly in self._end_step(end.step):
                self._emit(anomaly)
            self._outputs.reset()

    def stop(self, step: int, mode: Mode) -> None:
        if mode is WATCHED:
            self._stats.resolve()  # a NaN seen in a step that never reached its backward
            for anomaly in self._end_step(step):
                self._emit(anomaly)

    def _forward_anomalies(self, step: int) -> list[schema.Anomaly]:
        bad = [(info, call, found) for info, call, found in self._forward if found]
        self._forward.clear()
        if len(self._calls) > _MAX_HELD:
            dropped, self._calls = self._calls[: len(self._calls) // 2], self._calls[
                len(self._calls) // 2:]
            self._forget(dropped)
        if not bad:
            return []
        info, call, found = bad[0]
        return [schema.Anomaly(step, info.model, info.name, "nonfinite-forward", call, {
            "outputs": [{"index": i, "nan": nan, "inf": inf} for i, nan, inf in found],
            "modules_with_nonfinite_outputs": len(bad)})]

    def _end_step(self, step: int) -> list[schema.Anomaly]:
        """Anomalies of ``step``; call after the step's statistics are resolved."""
        out = self._forward_anomalies(step)
        for start, (ins, outs) in self._backward.items():
            received = any(s is not None and not math.isfinite(s[0]) for s in outs)
            if received or any(s is not None and not math.isfinite(s[0]) for s in ins):
                info = start.call.info
                out.append(schema.Anomaly(step, info.model, info.name, "nonfinite-backward",
                                          start.call.call_index, {"produced": not received}))
                break
        out += self._lost_gradients(step)
        self._backward.clear()
        return out

    def _lost_gradients(self, step: int) -> list[schema.Anomaly]:
        # a call may get its backward one step later (a GAN's generator): judge last step's calls
        judged = [c for c in self._calls if c.step < step]
        self._calls = [c for c in self._calls if c.step >= step]
        got = {call.info for call in judged if call in self._got_backward}
        self._forget(judged)
        out: list[schema.Anomaly] = []
        for call in judged:
            info = call.info
            if info in self._had_grad and info not in got:
                self._had_grad.discard(info)  # reported once, until it receives gradient again
                out.append(schema.Anomaly(call.step, info.model, info.name, "no-grad",
                                          call.call_index, {"had_gradient_before": True}))
        return out

    def _forget(self, calls: list[ForwardCall]) -> None:
        for call in calls:
            self._waiting.discard(call)
            self._got_backward.discard(call)

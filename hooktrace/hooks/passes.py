"""The core's backward half, and the step it ends: a call's backward pass begins at the first
gradient that reaches one of its outputs (``BackwardStart``), the gradients reaching its
outputs and inputs follow, and the end of the backward pass (``PassEnd``) ends the step.
``Passes`` holds what both halves count in a step (its mode, the events against
``--max-events``, the calls made) and how tracing stops on an error; ``core.CallTracker``,
the module-call half, extends it.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch

from hooktrace.hooks.dataflow import DataFlow
from hooktrace.hooks.gradhooks import GradHooks
from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.opzoom import OpZoom
from hooktrace.hooks.records import BackwardStart, ForwardCall, Mode, PassEnd, step_mode
from hooktrace.log.errors import LogWriteError, NonFiniteError
from hooktrace.log.options import TraceOptions

OFF, WATCHED, RECORDED = Mode.OFF, Mode.WATCHED, Mode.RECORDED


class CallHandle:
    """The core's own handle on one call, what its gradient hooks carry: its ``ForwardCall``'s
    fields once it returned. Flat fields, not the record: this lives as long as the autograd
    graph (often into the next step), and every object that does costs the garbage collector
    (the record is made again, equal, when the backward begins)."""

    __slots__ = ("step", "seq", "info", "index", "recompute", "n_in", "n_out")
    seq: int
    index: int
    recompute: bool
    n_in: int
    n_out: int

    def __init__(self, step: int) -> None:
        self.step = step
        self.info: ModInfo | None = None  # the other fields are set when the forward returns

    def record(self) -> ForwardCall:
        assert self.info is not None
        return ForwardCall(self.seq, self.step, self.info, self.index, self.recompute,
                           self.n_in, self.n_out)


class Passes:
    """A tracker's step and its backward passes; the observers' callbacks are set by
    ``CallTracker.start``."""

    zoom: OpZoom  # the module-call half's: stopped with the rest on an error

    def __init__(self, options: TraceOptions) -> None:
        self._options = options
        self._grads = GradHooks(self._on_grad, self._end_pass, self.fail)
        self._flow = DataFlow(self._grads)  # which calls made each input, in recorded steps
        self.active = False
        self.step = 0
        self.mode = step_mode(0, options, False)
        self.events = 0  # recorded forward ends and backward starts
        self.dropped = 0  # calls past --max-events
        self.error: str | None = None
        self._seq = itertools.count(1)
        self._max_events = options.max_events
        # calls of each module in this step, and of recomputations (activation checkpointing)
        self._calls: dict[ModInfo, int] = {}
        self._recomputed: dict[ModInfo, int] = {}
        # the calls whose backward this pass began
        self._backwards: dict[CallHandle, BackwardStart] = {}

    def fail(self, error: BaseException) -> None:
        """Stop tracing, say why once; the program goes on (with --strict, a failed log write
        is raised into it instead)."""
        first = self.error is None
        self.active = self._grads.active = self.zoom.active = False  # (zoom: until its call ends)
        self._flow.clear()  # its follower of operations off the program's stack
        if isinstance(error, LogWriteError):
            if first:
                self.error = str(error)
                print(f"hooktrace: {error}; tracing stopped (your script goes on)", file=sys.stderr)
            if self._options.strict:
                raise error
            return
        if first:
            self.error = f"{type(error).__name__}: {error}"
            print(f"hooktrace: internal error, tracing stopped (your script goes on): "
                  f"{self.error}", file=sys.stderr)

    def _take_event(self) -> bool:
        """Count one more recorded event; past --max-events refuse it (False): the rest of the
        run is not recorded."""
        if self.events < self._max_events:
            self.events += 1
            return True
        if self.dropped == 0:
            print(f"hooktrace: --max-events {self._options.max_events} reached at step "
                  f"{self.step}; recording stopped, the log stays valid", file=sys.stderr)
        self.dropped += 1
        self.mode = step_mode(self.step, self._options, True)
        return False

    def _on_grad(self, call: CallHandle, index: int, grad: torch.Tensor) -> None:
        start = self._backwards.get(call)
        if index < 0:
            if start is not None:
                for grad_input in self._to_grad_input[start.mode]:
                    grad_input(start, ~index, grad)
            return
        if start is None:  # first gradient of this pass
            start = self._start_backward(call)
            if start is None:
                return
        for grad_output in self._to_grad_output[start.mode]:
            grad_output(start, index, grad)

    def _start_backward(self, call: CallHandle) -> BackwardStart | None:
        if call.info is None:  # its forward has not returned
            return None
        mode = self.mode
        if mode is RECORDED:
            if not self._take_event():
                return None
            seq = next(self._seq)
        elif mode is WATCHED:
            seq = 0  # a watched step writes no event
            if self.dropped and call.seq >= 0:
                self.dropped += 1  # the cap came after its forward event: this one is dropped
        else:
            return None
        start = self._backwards[call] = BackwardStart(call.record(), seq, self.step, mode)
        for backward_start in self._to_backward_start[mode]:
            backward_start(start)
        return start

    def backward_returned(self, step: int) -> None:
        """The outermost ``backward()`` returned with no pass ended since ``step`` began: no
        module hook saw it (compiled code). A watched step still ends, counted and judged."""
        if self.step == step and self.mode is WATCHED and self.active and not self._backwards:
            self._end_pass()  # raises as at a pass's end: --strict, --break-on nan

    def _end_pass(self) -> None:
        called = tuple({**self._calls, **self._recomputed})  # in the order they first returned
        reached = tuple({start.call.info: None for start in self._backwards.values()})
        self._backwards.clear()
        end = PassEnd(self.step, self.mode, called, reached)
        for backward_end in self._to_backward_end:
            try:
                backward_end(end)
            except (LogWriteError, NonFiniteError):
                raise  # a log that cannot be written: the step is not over
            except Exception as e:  # the other observers still finish the step
                self.fail(e)
        self.step += 1
        # a graph may be backpropagated again (retain_graph, a gradient penalty): keep the
        # previous step's calls listening on leaf inputs, forget older ones
        self._grads.prune_leaf_hooks(lambda call: call.step >= self.step - 1)
        self._calls.clear()
        self._recomputed.clear()
        self._flow.clear()
        self.mode = step_mode(self.step, self._options, self.dropped > 0)
        last = self._options.steps.last
        if last is not None and self.step > last and self.mode is OFF:
            self._remove_hooks()  # nothing more to record: the rest of the run pays nothing

    def _remove_hooks(self) -> None:
        raise NotImplementedError  # the module-call half's

    _to_backward_start: list[list[Callable[[BackwardStart], None]]]
    _to_grad_output: list[list[Callable[[BackwardStart, int, torch.Tensor], None]]]
    _to_grad_input: list[list[Callable[[BackwardStart, int, torch.Tensor], None]]]
    _to_backward_end: list[Callable[[PassEnd], None]]

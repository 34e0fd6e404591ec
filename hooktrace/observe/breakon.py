"""``--break-on nan``: stop the program at the first module that produces NaN/Inf.

In a forward, pdb opens in the user's code, at the line that called the module (the innermost
frame outside torch and hooktrace): its commands act as at a breakpoint there, ``q`` ends the
program with ``BdbQuit`` as pdb's does. Without a terminal, ``NonFiniteError`` is raised: the
program stops, as it would have at the prompt. In a backward, the first call whose input
gradient is NaN/Inf while every gradient reaching it was finite raises ``NonFiniteError``. It
stops once.
"""

from __future__ import annotations

import math
import sys
from types import FrameType
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.owners import caller_frame
from hooktrace.hooks.records import BackwardStart, ForwardEnd, Mode, Observer, PassEnd
from hooktrace.hooks.sites import shown
from hooktrace.log.errors import NonFiniteError
from hooktrace.log.words import fqn_text
from hooktrace.observe.outputs import OutputCheck
from hooktrace.observe.stats import TensorStats


def info_label(info: ModInfo) -> str:
    return f"{fqn_text(info.fqn)} ({info.cls})"


class BreakOnNonfinite(Observer):
    """Needs statistics that read every number at once (``TensorStats(immediate=True)``)."""

    def __init__(self, stats: TensorStats) -> None:
        self._stats = stats
        self._outputs = OutputCheck(stats)
        self._armed = True  # one stop in all
        self._received: dict[BackwardStart, bool] = {}  # a NaN/Inf gradient reached the call

    def forward_end(self, end: ForwardEnd) -> None:
        if not self._armed:
            return
        found = self._outputs.check(end.outputs)
        if found:
            self._armed = False
            call = end.call
            _break_nonfinite(call.step, call.info, found)

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        if self._armed and not self._finite(start, grad):
            self._received[start] = True

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        if not self._armed or self._finite(start, grad):
            return
        if not self._received.get(start, False):
            self._armed = False
            raise NonFiniteError(
                f"hooktrace --break-on nan: the backward of {info_label(start.call.info)} "
                f"produced a NaN/Inf gradient for its input {index} at step {start.step}")

    def backward_end(self, end: PassEnd) -> None:
        self._received.clear()
        self._outputs.reset()

    def _finite(self, start: BackwardStart, grad: torch.Tensor) -> bool:
        # the same call as the log writer's or the watch's just before: the numbers are reused
        numbers: list[Any] = [None]
        self._stats.grad(grad, numbers, 0, start.mode is Mode.RECORDED)
        return numbers[0] is None or math.isfinite(numbers[0][0])


def _break_nonfinite(step: int, info: ModInfo, found: list[list[int]]) -> None:
    """--break-on nan: open pdb at the user's line that called the module; without a
    terminal, raise instead."""
    counts = ", ".join(f"output {i}: {nan} NaN, {inf} Inf" for i, nan, inf in found)
    frame = caller_frame()
    line = "" if frame is None else f" called at {shown(frame.f_code.co_filename)}:{frame.f_lineno}"
    message = (f"hooktrace --break-on nan: {info_label(info)} produced NaN/Inf at step {step} "
               f"({counts}){line}")
    if frame is None or not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise NonFiniteError(f"{message}; no terminal for pdb: the program stops")
    print(f"{message}\nhooktrace: pdb at that line, its output not yet assigned: 'n' runs the "
          "line, 'c' goes on, 'q' quits", file=sys.stderr)
    _debug_at(frame)


def _debug_at(frame: FrameType) -> None:
    """pdb at ``frame`` now, as at a breakpoint there: ``Bdb.set_trace`` would stop at the next
    event, in hooktrace's or torch's code still running. Its commands act when the prompt
    closes: stepping traces from there, ``q`` raises ``BdbQuit`` into the program."""
    import bdb
    import pdb

    debugger = pdb.Pdb(skip=["hooktrace", "hooktrace.*"])
    debugger.reset()
    outer: FrameType | None = frame
    while outer is not None:  # as set_trace does: the frames it may stop in, to the bottom
        outer.f_trace = debugger.trace_dispatch
        debugger.botframe = outer
        outer = outer.f_back
    debugger.interaction(frame, None)
    if debugger.quitting:
        raise bdb.BdbQuit
    if debugger.stoplineno != -1 or debugger.breaks:  # not 'c' without breakpoints
        sys.settrace(debugger.trace_dispatch)

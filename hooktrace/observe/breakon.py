"""``--break-on nan``: stop the program at the first module that produces NaN/Inf.

In a forward, pdb opens in ``_break_nonfinite`` with the module and its tensors in reach (without
a terminal, ``NonFiniteError`` is raised); in a backward, the first call whose input gradient is
NaN/Inf while every gradient reaching it was finite raises ``NonFiniteError``. It stops once.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import BackwardStart, ForwardEnd, Mode, Observer, PassEnd
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
            _break_nonfinite(call.step, end.start.module, call.info, end.args, end.kwargs,
                             end.output, found)

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


def _break_nonfinite(step: int, module: nn.Module, info: ModInfo, inputs: tuple[Any, ...],
                     kwargs: dict[str, Any], output: Any, found: list[list[int]]) -> None:
    """--break-on nan: open pdb here, with the module and its tensors in reach; without a
    terminal, raise instead."""
    where = ", ".join(f"output {i}: {nan} NaN, {inf} Inf" for i, nan, inf in found)
    message = (f"hooktrace --break-on nan: {info_label(info)} produced NaN/Inf at step {step} "
               f"({where})")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise NonFiniteError(message)
    print(f"{message}\nhooktrace: in reach: module, inputs, kwargs, output; 'c' continues",
          file=sys.stderr)
    import pdb

    pdb.Pdb().set_trace()

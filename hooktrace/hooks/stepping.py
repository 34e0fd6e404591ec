"""The optimizer step, the third moment the core follows (beside module calls and backward
passes): one global pre-hook and one post-hook for every optimizer, each handing an
``OptimizerStep`` to the observers that override ``optimizer_stepping`` or
``optimizer_stepped``, in the observers' order.

An observer's exception never reaches the program's ``optimizer.step()``: that observer is
no longer handed that moment (it goes quiet) and the others go on. The hooks stay until
tracing stops, also past the last recorded step (the loop's facts are about the whole run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from hooktrace.hooks.records import Observer, OptimizerStep, wanting


class StepHooks:
    """Registered by ``start``, removed by ``stop``."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._before: list[Callable[[OptimizerStep], None]] = []
        self._after: list[Callable[[OptimizerStep], None]] = []

    def start(self, observers: Sequence[Observer]) -> None:
        self._before = wanting(observers, "optimizer_stepping")
        self._after = wanting(observers, "optimizer_stepped")
        self._handles = [register_optimizer_step_pre_hook(self._stepping),
                         register_optimizer_step_post_hook(self._stepped)]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _stepping(self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> None:
        _hand(self._before, OptimizerStep(optimizer, args, kwargs))

    def _stepped(self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        _hand(self._after, OptimizerStep(optimizer, args, kwargs))


def _hand(callbacks: list[Callable[[OptimizerStep], None]], step: OptimizerStep) -> None:
    for callback in list(callbacks):
        try:
            callback(step)
        except Exception:  # never into the program: this observer goes quiet
            callbacks.remove(callback)

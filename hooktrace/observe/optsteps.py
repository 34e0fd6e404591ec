"""Each optimizer's steps, in the units training uses, for the diagnosis observer (whose global
optimizer step hooks call it): after which backward pass it stepped, with which learning rate,
and which modules it holds; one ``optimizer-steps`` signal per optimizer and model when tracing
stops.

What it tells the checker: where gradient accumulation windows end (a step after every 16th
pass), and when weights first move (the first step with lr > 0: a warmup from lr 0 makes the
first steps no-ops, so a zero-initialised layer such as LoRA's ``lora_B`` is still zero after
them).

Cost: at an optimizer's first step, a walk of its parameters (their modules); at each step, its
groups' learning rates read (a float per group) and two appends while fewer than ``LISTED``.
"""

from __future__ import annotations

import math
import weakref

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

LISTED = 64  # steps listed per optimizer: the signal says how many there were


class _Steps:
    """One optimizer's steps so far."""

    __slots__ = ("cls", "held", "after", "lr", "count", "moving")

    def __init__(self, cls: str, held: dict[int, list[str]]) -> None:
        self.cls = cls
        self.held = held  # per model, the modules whose trainable parameters it holds
        self.after: list[int] = []  # the backward pass (step) each step came after, -1: none
        self.lr: list[float | None] = []  # the largest learning rate of its groups, at each
        self.count = 0
        self.moving: int | None = None  # the pass after which it first stepped with lr > 0


class OptimizerSteps:
    def __init__(self, emit: Emit, owner: dict[int, ModInfo]) -> None:
        self._emit = emit
        self._owner = owner  # the diagnosis's: id(trainable parameter) -> its module
        self._looked: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Steps] = (
            weakref.WeakKeyDictionary())
        self._all: list[_Steps] = []  # kept past their optimizers: said when tracing stops

    def stepping(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                 after: int) -> None:
        """Before a step that comes after backward pass ``after`` (-1: before any)."""
        steps = self._looked.get(optimizer)
        if steps is None:
            steps = self._looked[optimizer] = _Steps(type(optimizer).__name__,
                                                     self._held(params))
            self._all.append(steps)
        lr = _lr(optimizer)
        steps.count += 1
        if len(steps.after) < LISTED:
            steps.after.append(after)
            steps.lr.append(lr)
        if steps.moving is None and (lr is None or lr > 0):
            steps.moving = after

    def _held(self, params: list[torch.Tensor]) -> dict[int, list[str]]:
        held: dict[int, dict[str, None]] = {}
        for info in map(self._owner.get, map(id, params)):
            if info is not None:
                held.setdefault(info.model, {})[info.fqn] = None
        return {model: list(names) for model, names in sorted(held.items())}

    def stop(self) -> None:
        """An ``optimizer-steps`` signal per optimizer that stepped and model it holds."""
        for steps in self._all:
            for model, names in steps.held.items():
                self._emit(schema.Signal(
                    max(steps.after[0], 0), model, "", SignalKind.OPTIMIZER_STEPS, {
                    "optimizer": steps.cls, "count": steps.count, "after": steps.after,
                    "lr": steps.lr, "moving": steps.moving, "held": names}))
        self._all.clear()


def _lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The largest learning rate of its groups with parameters; None where one is not a number
    read on the host (a tensor on a device: a read would wait for it)."""
    best = 0.0
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if not group["params"]:
            continue
        if isinstance(lr, torch.Tensor):
            if lr.device.type != "cpu" or lr.numel() != 1:
                return None
            lr = lr.item()
        if not isinstance(lr, (int, float)) or math.isnan(lr):
            return None
        best = max(best, float(lr))
    return best

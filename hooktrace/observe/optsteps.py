"""The one ledger of optimizer steps: per optimizer, which modules it holds, after which backward
pass each step came, its learning rates, and what each step found (``Optimizers``, whose global
optimizer step hooks call it). One ``optimizer-steps`` signal per optimizer and model when
tracing stops (its fields: ``log/signals.py``), all facts; ``check`` decides what they mean. A
warmup from lr 0 leaves LoRA's zero ``lora_B`` zero after its first steps (``moving``); a step
that applies the very ``.grad`` its last step left is looked for on one parameter, the first
with a ``.grad`` at its first step, and not where a closure recomputes them (LBFGS); an
optimizer built anew in the loop takes over another's parameters (``took_over``).

Cost: at an optimizer's first step, a walk of its parameters (their modules); at each step, its
groups' lrs read (a float per group), a look at their ``.grad`` until one has one, one
``.grad`` identity and version.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

LISTED = 64  # steps listed per optimizer: the signal says how many there were
SHOWN = 20  # steps listed per fact (again, a group at lr 0)


class _Steps:
    """One optimizer's steps so far, and what they found."""

    __slots__ = ("cls", "held", "after", "lr", "count", "moving", "looked", "last", "again",
                 "again_count", "last_again", "most", "row", "index", "grad", "version",
                 "zero", "moved", "param", "state", "took_over", "resumed")

    def __init__(self, cls: str, held: dict[int, list[str]], param: torch.Tensor | None) -> None:
        self.cls = cls
        self.held = held  # per model, the modules whose trainable parameters it holds
        self.after: list[int] = []  # the backward pass (step) each step came after, -1: none
        self.lr: list[float | None] = []  # the largest learning rate of its groups, at each
        self.count = 0
        self.moving: int | None = None  # the pass after which it first stepped with lr > 0
        self.looked = 0  # steps without a closure, in distinct passes: those looked at
        self.last = -1  # the last step it stepped in
        self.again: list[int] = []  # steps where it applied the gradients of its last again
        self.again_count = 0
        self.last_again = -1
        self.most = 1  # steps in a row with the same gradients
        self.row = 1
        # its first parameter with a .grad at its first step, the one looked at (-2: not yet)
        self.index = -2
        self.grad: weakref.ref[torch.Tensor] | None = None  # its .grad as the last step left it
        self.version = -1
        # group index -> [the steps at lr 0 with gradients while another moved (SHOWN), how
        # many, the largest lr beside it, per model its modules (named then: the model may be
        # gone when tracing stops)]
        self.zero: dict[int, list[Any]] = {}
        self.moved: set[int] = set()  # the groups that stepped at lr > 0 with gradients
        self.param = None if param is None else weakref.ref(param)  # its first parameter
        self.state = False  # whether it kept state (moments, a step count, a momentum buffer)
        self.took_over: dict[str, Any] | None = None
        self.resumed = False

    def facts(self, model: int, names: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"optimizer": self.cls, "count": self.count, "after": self.after,
                               "lr": self.lr, "moving": self.moving, "held": names}
        if self.again:
            out["again"] = {"steps": self.again, "count": self.again_count, "most": self.most,
                            "of": self.looked}
        zero = [{"group": index, "steps": steps, "count": count, "others": others,
                 "moved": index in self.moved, "modules": modules[model]}
                for index, (steps, count, others, modules) in sorted(self.zero.items())
                if model in modules]
        if zero:
            out["zero_lr"] = zero
        if self.took_over is not None:
            out["took_over"] = self.took_over
        if self.resumed:
            out["resumed"] = True
        return out


class OptimizerSteps:
    def __init__(self, emit: Emit, owner: dict[int, ModInfo]) -> None:
        self._emit = emit
        self._owner = owner  # id(trainable parameter) -> its module
        self._looked: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Steps] = (
            weakref.WeakKeyDictionary())
        self._all: list[_Steps] = []  # kept past their optimizers: said when tracing stops
        self._holder_of: dict[int, _Steps] = {}  # id(first parameter) -> its last holder

    def stepping(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                 step: int, after: int, closure: bool) -> None:
        """Before a step in ``step`` that comes after backward pass ``after`` (-1: before any)."""
        steps = self._looked.get(optimizer)
        if steps is None:
            steps = self._looked[optimizer] = self._first(optimizer, params, after)
        lr = _lr(optimizer)
        steps.count += 1
        if len(steps.after) < LISTED:
            steps.after.append(after)
            steps.lr.append(lr)
        if steps.moving is None and (lr is None or lr > 0):
            steps.moving = after
        if closure:
            return  # a closure recomputes the gradients (LBFGS): not looked at
        param = steps.param() if steps.param is not None else None
        if param is not None and self._holder_of.get(id(param)) is not steps:
            steps.resumed = True
        self._groups(steps, optimizer, max(after, 0))
        if steps.index == -2:
            return  # its first step: no gradient of its own to compare with yet
        if step != steps.last:
            steps.looked += 1
            steps.last = step
        grad = steps.grad() if steps.grad is not None else None
        if (grad is not None and grad._version == steps.version
                and steps.index < len(params) and params[steps.index].grad is grad):
            steps.row += 1
            steps.most = max(steps.most, steps.row)
            if steps.last_again != step:
                steps.last_again = step
                steps.again_count += 1
                if len(steps.again) < SHOWN:
                    steps.again.append(step)
        else:
            steps.row = 1

    def _first(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
               after: int) -> _Steps:
        """Its ledger, at its first step; whether it takes over another's parameters."""
        first = params[0] if params else None
        steps = _Steps(type(optimizer).__name__, self._names(params), first)
        self._all.append(steps)
        if first is None:
            return steps
        before = self._holder_of.get(id(first))
        if before is not None and before.param is not None and before.param() is first:
            steps.took_over = {"step": max(after, 0), "steps": before.count,
                               "state": before.state}
        self._holder_of[id(first)] = steps
        return steps

    def _groups(self, steps: _Steps, optimizer: torch.optim.Optimizer, step: int) -> None:
        lrs: dict[int, float] = {}
        for index, group in enumerate(optimizer.param_groups):
            lr = group.get("lr")
            if isinstance(lr, (int, float)) and not math.isnan(lr) and any(
                    p.grad is not None for p in group["params"]):
                lrs[index] = float(lr)
        top = max(lrs.values(), default=0.0)
        for index, lr in lrs.items():
            if lr > 0:
                steps.moved.add(index)
            elif top > 0 and index not in steps.moved:
                zero = steps.zero.get(index)
                if zero is None:
                    zero = steps.zero[index] = [[], 0, 0.0, self._names(
                        optimizer.param_groups[index]["params"])]
                if len(zero[0]) < SHOWN:
                    zero[0].append(step)
                zero[1] += 1
                zero[2] = top

    def stepped(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                step: int) -> bool:
        """After a step: the gradient it leaves (the next step's look), whether it kept state;
        True after its first."""
        steps = self._looked.get(optimizer)
        if steps is None:
            return False
        steps.state = steps.state or bool(optimizer.state)
        first = steps.index == -2
        if first:
            steps.looked, steps.last = 1, step
            steps.index = next((i for i, p in enumerate(params) if p.grad is not None), -1)
        grad = params[steps.index].grad if 0 <= steps.index < len(params) else None
        steps.grad = weakref.ref(grad) if grad is not None else None
        steps.version = grad._version if grad is not None else -1
        return first

    def _names(self, params: list[torch.Tensor]) -> dict[int, list[str]]:
        return modules_of(self._owner, params)

    def stop(self) -> None:
        """An ``optimizer-steps`` signal per optimizer that stepped and model it holds."""
        for steps in self._all:
            for model, names in steps.held.items():
                self._emit(schema.Signal(max(steps.after[0], 0), model, "",
                                         SignalKind.OPTIMIZER_STEPS, steps.facts(model, names)))
        self._all.clear()
        self._holder_of.clear()


def modules_of(owner: dict[int, ModInfo], params: list[torch.Tensor]) -> dict[int, list[str]]:
    """Per model (sorted), the modules of ``params`` (``owner``: by id), in their order."""
    held: dict[int, dict[str, None]] = {}
    for info in map(owner.get, map(id, params)):
        if info is not None:
            held.setdefault(info.model, {})[info.fqn] = None
    return {model: list(names) for model, names in sorted(held.items())}


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

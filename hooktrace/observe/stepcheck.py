"""The step, explained: whether each optimizer step does what the gradients of the passes
before it, its param groups and its state say it should (issue 36). PyTorch's global optimizer
step hooks and the end of each backward pass look at a few things, and one ``step-unexplained``
signal per broken expectation (``detail.expectation``) is written when tracing stops:

* ``group-lr``: a param group whose parameters got gradients stepped at lr 0 in every one of
  its steps (two at least) while another group of the same optimizer stepped at lr > 0 (a
  learning rate set on one group only); a warmup from lr 0 starts every group there, not one;
* ``state``: a new optimizer took over the parameters an optimizer with state (moments, a step
  count, a momentum buffer) held after at most two of its steps, twice or more (built anew in
  the loop: its state starts empty each time; plain SGD has none to lose, and a rebuild at an
  unfreeze happens once);
* ``cleared``: between two backward passes with no optimizer step between (one accumulation),
  the sampled parameters' ``.grad`` was dropped (a new tensor, their weights unchanged: their
  version the same) twice or more before one step that then applies the last pass's
  ``.grad`` as it left it: ``zero_grad()`` per micro-batch, so the step applies the last
  micro-batch's gradient only (an analysis pass then a real one, or SAM's two passes around a
  weight change, clear once or change the weights; PCGrad's per-task passes set a combined
  ``.grad`` before the step; under a GradScaler, not judged: a step it skips looks the same);
* ``sign``: in recorded steps, ``SAMPLE`` elements of the gradients of ``PARAMS`` parameters
  read at the end of the backward pass and again before the step that applies them: every
  sampled gradient multiplied by the same negative factor between them (``clip_grad_norm_``
  with a negative ``max_norm``), in two steps or more, so the step moves the weights up the loss;
* ``update`` (``stepmove.py``): the same sample's weights read just before and after the step,
  their move against the update the optimizer's kind makes of their gradient, lr and state.

Cost: at each optimizer step, a float per group and a look at its parameters' ``.grad`` until
one has one; at each backward pass's end, ``PARAMS`` identity and version reads; in recorded
steps on the CPU (``stats.on_host``: a read on a device would wait for it), two gathers of
``SAMPLE`` elements per sampled parameter. Nothing per module call.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.lossscale import find_scaler
from hooktrace.observe.stats import on_host
from hooktrace.observe.stepmove import Moves, Sampled

PARAMS = 4  # parameters sampled
SAMPLE = 16  # elements of each one's gradient
REBUILT_AFTER = 2  # steps an optimizer took before a new one took over: built anew in the loop
LISTED = 20  # steps listed in a signal


class _Groups:
    """One optimizer's param groups over its steps: per group, the steps it stepped at lr 0
    with gradients while another group moved, and whether it ever moved itself."""

    __slots__ = ("cls", "zero", "counts", "moved", "others", "names")

    def __init__(self, cls: str) -> None:
        self.cls = cls
        self.zero: dict[int, list[int]] = {}  # group index -> those steps (the first LISTED)
        self.counts: dict[int, int] = {}  # group index -> how many
        self.moved: set[int] = set()  # the groups that stepped at lr > 0 with gradients
        self.others: dict[int, float] = {}  # group index -> the largest lr beside it
        # group index -> per model, its modules: named when first seen, as the model may be
        # gone when tracing stops (a script's main() returned, the collector ran)
        self.names: dict[int, dict[int, list[str]]] = {}


class _Holder:
    """An optimizer, as the holder of its first parameter: its steps, and whether it kept
    state."""

    __slots__ = ("optimizer", "cls", "steps", "state", "param")

    def __init__(self, optimizer: torch.optim.Optimizer, param: torch.Tensor) -> None:
        self.optimizer = weakref.ref(optimizer)
        self.cls = type(optimizer).__name__
        self.steps = 0
        self.state = False
        self.param = weakref.ref(param)


class StepExplained(Observer):
    """Writes a ``step-unexplained`` signal per expectation a training step broke."""

    follows = ()  # no module call: first sights and passes only

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._owner: dict[int, ModInfo] = {}  # id(trainable parameter) -> its module
        self._modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []
        self._step = 0  # the last backward pass
        self._stepped = 0  # optimizer steps so far
        self._off = False
        # the sampled parameters, their .grad and version at the last pass's end, the optimizer
        # steps then; their sampled gradient values where that pass was recorded (on the CPU)
        self._sample: list[weakref.ref[torch.Tensor]] = []
        self._sample_names: dict[int, list[str]] = {}  # per model, the sample's modules
        self._grads: list[weakref.ref[torch.Tensor] | None] = []
        self._versions: list[int] = []
        self._gradversions: list[int] = []
        self._stepped_then = -1
        self._values: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self._moving: Sampled = []  # the same sample's parameters and indices, for the moves
        self._moves = Moves(self._names)
        self._scaler: Callable[[], Any] | None = None  # the GradScaler, once looked for
        self._cleared: list[int] = []  # passes of this accumulation whose gradients were dropped
        # accumulations whose gradients were cleared twice or more: the first's (first such
        # pass, how many), and how many; passes whose gradient was negated (the first LISTED,
        # each with its factor), and how many. Counts, not lists: a run may be long
        self._cleared_first: tuple[int, int] | None = None
        self._cleared_windows = 0
        self._flipped: list[tuple[int, float]] = []
        self._flipped_count = 0
        self._groups: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Groups] = (
            weakref.WeakKeyDictionary())
        self._all_groups: list[_Groups] = []
        self._holders: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Holder] = (
            weakref.WeakKeyDictionary())
        self._holder_of: dict[int, _Holder] = {}  # id(first parameter) -> its last holder
        self._rebuilt: list[int] = []  # the first LISTED steps where one was, and how many
        self._rebuilt_count = 0
        self._rebuilt_cls = ""
        self._rebuilt_models: set[int] = set()
        self._alternating = False  # an older holder stepped again: optimizers in turns

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._modules.append((weakref.ref(module), info))
            for p in module._parameters.values():
                if p is not None:
                    self._owner[id(p)] = info

    # -- passes ------------------------------------------------------------------------------
    def backward_end(self, end: PassEnd) -> None:
        self._step = end.step
        if self._off:
            return
        try:
            self._pass(end)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._stop_looking()

    def _pass(self, end: PassEnd) -> None:
        params = [p for p in (ref() for ref in self._sample) if p is not None]
        if len(params) < len(self._sample) or not params:
            params = self._pick()
            self._grads = []
        if self._stepped == self._stepped_then and self._grads:
            dropped = kept = 0
            for p, ref, version in zip(params, self._grads, self._versions, strict=False):
                if ref is None or p.grad is None:
                    continue
                if p.grad is not ref() and p._version == version:
                    dropped += 1
                else:
                    kept += 1
            if dropped and not kept and not self._scaled():
                self._cleared.append(end.step)
        self._grads = [None if p.grad is None else weakref.ref(p.grad) for p in params]
        self._versions = [p._version for p in params]
        self._gradversions = [-1 if p.grad is None else p.grad._version for p in params]
        self._stepped_then = self._stepped
        self._values = None
        self._moving = []
        if end.mode is Mode.RECORDED and params and on_host(params):
            self._values = [(p, i, g.reshape(-1)[i].clone()) for p in params
                            if (g := p.grad) is not None and g.layout is torch.strided
                            and (i := _indices(g.numel())).numel()]
            self._moving = [(weakref.ref(p), i) for p, i, _ in self._values]

    def _scaled(self) -> bool:
        """Whether the code running backward holds an enabled GradScaler, looked for at the
        first drop: its ``step`` skips the optimizer's where gradients are not finite, and the
        ``zero_grad`` of the next iteration then looks like one inside an accumulation."""
        if self._scaler is None:
            main = sys._current_frames().get(threading.main_thread().ident or -1)
            found = find_scaler(sys._getframe()) or find_scaler(main)
            self._scaler = (lambda: None) if found is None else weakref.ref(found)
        scaler = self._scaler()
        return scaler is not None and bool(scaler.is_enabled())

    def _pick(self) -> list[torch.Tensor]:
        """Up to ``PARAMS`` trainable parameters with a gradient now, the first modules'."""
        picked: list[torch.Tensor] = []
        for ref, info in self._modules:
            module = ref() if info.ref() is not None else None
            for p in module._parameters.values() if module is not None else ():
                if p is not None and p.requires_grad and p.grad is not None:
                    picked.append(p)
            if len(picked) >= PARAMS:
                break
        picked = picked[:PARAMS]
        self._sample = [weakref.ref(p) for p in picked]
        self._sample_names = self._names(picked)
        return picked

    # -- optimizer steps ---------------------------------------------------------------------
    def optimizer_stepping(self, step: OptimizerStep) -> None:
        optimizer, args, kwargs = step
        if self._off:
            return
        if any(a is not None for a in args[1:]) or kwargs.get("closure") is not None:
            return  # a closure recomputes the gradients (LBFGS): not judged
        try:
            self._look_groups(optimizer)
            self._look_holder(optimizer)
            if self._cleared and not self._applies_last_pass():
                self._cleared = []  # gradients combined by hand (PCGrad): not one pass's
            self._moves.before(optimizer, self._moving, kwargs)
            if self._values is not None and self._stepped == self._stepped_then:
                self._look_sign(optimizer)
        except Exception:
            self._stop_looking()

    def _applies_last_pass(self) -> bool:
        """Whether the sampled parameters' ``.grad`` is still the tensor the last pass left,
        unchanged since: the step applies that pass's gradient alone."""
        return any(ref is not None and p.grad is not None and p.grad is ref()
                   and p.grad._version == version for p, ref, version in
                   zip(self._live_sample(), self._grads, self._gradversions, strict=False))

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if self._off:
            return
        optimizer = step.optimizer
        self._stepped += 1
        try:
            self._moves.after(optimizer, self._step)
        except Exception:
            self._stop_looking()
        if len(self._cleared) >= 2:
            if self._cleared_first is None:
                self._cleared_first = (self._cleared[0], len(self._cleared))
            self._cleared_windows += 1
        self._cleared = []
        holder = self._holders.get(optimizer)
        if holder is not None:
            holder.steps += 1
            holder.state = holder.state or bool(optimizer.state)

    def _look_groups(self, optimizer: torch.optim.Optimizer) -> None:
        groups = self._groups.get(optimizer)
        if groups is None:
            groups = self._groups[optimizer] = _Groups(type(optimizer).__name__)
        lrs: dict[int, float] = {}
        for index, group in enumerate(optimizer.param_groups):
            lr = group.get("lr")
            if isinstance(lr, (int, float)) and not math.isnan(lr) and any(
                    p.grad is not None for p in group["params"]):
                lrs[index] = float(lr)
        top = max(lrs.values(), default=0.0)
        for index, lr in lrs.items():
            if lr > 0:
                groups.moved.add(index)
            elif top > 0 and index not in groups.moved:
                if not groups.zero and len(self._all_groups) < LISTED:
                    self._all_groups.append(groups)  # kept past it, until tracing stops
                steps = groups.zero.setdefault(index, [])
                if len(steps) < LISTED:
                    steps.append(self._step)
                groups.counts[index] = groups.counts.get(index, 0) + 1
                groups.others[index] = top
                if index not in groups.names:
                    groups.names[index] = self._names(optimizer.param_groups[index]["params"])

    def _look_holder(self, optimizer: torch.optim.Optimizer) -> None:
        """At an optimizer's first step, whether it took over from one with state that had
        stepped at most ``REBUILT_AFTER`` times; at a later one, whether an older holder is
        stepping again (optimizers in turns over the same parameters)."""
        holder = self._holders.get(optimizer)
        if holder is not None:
            if self._holder_of.get(id(holder.param())) is not holder:
                self._alternating = True
            return
        first = next((p for group in optimizer.param_groups for p in group["params"]), None)
        if first is None:
            return
        holder = self._holders[optimizer] = _Holder(optimizer, first)
        before = self._holder_of.get(id(first))
        if (before is not None and before.param() is first
                and before.optimizer() is not optimizer and before.state
                and 0 < before.steps <= REBUILT_AFTER):
            self._rebuilt_count += 1
            if len(self._rebuilt) < LISTED:
                self._rebuilt.append(self._step)
            self._rebuilt_cls = holder.cls
            info = self._owner.get(id(first))
            if info is not None:
                self._rebuilt_models.add(info.model)
        self._holder_of[id(first)] = holder

    def _look_sign(self, optimizer: torch.optim.Optimizer) -> None:
        """The sampled gradients now against the same elements at the last pass's end: each
        the other times one negative factor."""
        values, self._values = self._values, None
        assert values is not None
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        factors: list[float] = []
        for p, i, before in values:
            if id(p) not in held or p.grad is None:
                continue
            now = p.grad.reshape(-1)[i].to(before.dtype)
            norm = float(before.double().square().sum())
            if not norm:
                continue
            factor = float((now.double() * before.double()).sum()) / norm
            off = float((now.double() - factor * before.double()).square().sum())
            if off > 1e-6 * norm * max(factor * factor, 1e-12):
                return  # not one factor: the gradient changed otherwise (not judged)
            factors.append(factor)
        if factors and all(f < 0 for f in factors):
            self._flipped_count += 1
            if len(self._flipped) < LISTED:
                self._flipped.append((self._step, max(factors)))

    def _live_sample(self) -> list[torch.Tensor]:
        return [p for p in (ref() for ref in self._sample) if p is not None]

    def _stop_looking(self) -> None:
        self._off = True
        self._values = None
        self._moving = []

    # -- the end -----------------------------------------------------------------------------
    def stop(self, step: int, mode: Mode) -> None:
        names = self._sample_names  # named when picked: the models may be gone by now
        sampled = sorted(names)
        if self._cleared_first is not None:
            first, count = self._cleared_first
            for model in sampled:
                self._say(first, model, "cleared", {
                    "windows": self._cleared_windows, "passes": count,
                    "modules": names.get(model, [])})
        if self._flipped_count >= 2:
            for model in sampled:
                self._say(self._flipped[0][0], model, "sign", {
                    "steps": [s for s, _ in self._flipped], "count": self._flipped_count,
                    "factor": self._flipped[0][1], "modules": names.get(model, [])})
        if self._rebuilt_count >= 2 and not self._alternating:
            for model in sorted(self._rebuilt_models):
                self._say(self._rebuilt[0], model, "state", {
                    "optimizer": self._rebuilt_cls, "steps": self._rebuilt,
                    "count": self._rebuilt_count})
        for first, named, detail in self._moves.verdicts():
            for model, modules in sorted(named.items()):
                self._say(first, model, "update", {**detail, "modules": modules})
        for groups in self._all_groups:
            self._said_groups(groups)
        self._all_groups.clear()
        self._values = None
        self._moving = []

    def _said_groups(self, groups: _Groups) -> None:
        for index, steps in sorted(groups.zero.items()):
            count = groups.counts.get(index, 0)
            if index in groups.moved or count < 2:
                continue
            for model, names in sorted(groups.names.get(index, {}).items()):
                self._say(steps[0], model, "group-lr", {
                    "optimizer": groups.cls, "group": index, "steps": steps,
                    "count": count, "others": groups.others.get(index, 0.0),
                    "modules": names})

    def _names(self, params: list[torch.Tensor]) -> dict[int, list[str]]:
        """Per model, the modules of ``params``, in their order."""
        out: dict[int, dict[str, None]] = {}
        for p in params:
            info = self._owner.get(id(p))
            if info is not None:
                out.setdefault(info.model, {})[info.fqn] = None
        return {model: list(names) for model, names in out.items()}

    def _say(self, step: int, model: int, expectation: str, detail: dict[str, Any]) -> None:
        modules = detail.get("modules") or [""]
        self._emit(schema.Signal(step, model, modules[0], SignalKind.STEP_UNEXPLAINED,
                                 {"expectation": expectation, **detail}))


def _indices(n: int) -> torch.Tensor:
    """Up to ``SAMPLE`` positions spread evenly over a tensor of ``n`` elements."""
    k = min(n, SAMPLE)
    return torch.arange(k) * (n - 1) // max(k - 1, 1)

"""The optimizer step, as facts: the one observer of PyTorch's global optimizer step hooks (the
core's ``StepHooks``) that keeps which optimizer holds which parameters, its steps and learning
rates (``optsteps.OptimizerSteps``, the ledger), what it holds against the models
(``optimizer_view``), and what the ``.grad`` it is about to apply is:

* parameters no optimizer holds: the parameters of every optimizer that steps are kept; when
  one steps with parameters not seen before, each model's modules are sorted by them (an
  ``optimizers`` signal when that changes);
* gradients left uncleared: whether an optimizer steps with a ``.grad`` that is still the
  tensor its previous step left, one version on for each backward pass that reached its model
  since (each adds to it once) and never reset (a GAN's discriminator, whose gradients the
  generator's backward adds to and the next ``zero_grad`` clears, is fine). A hook per
  parameter would tell it too, at 29 us a parameter a step (W1: 11 ms a step);
* gradients cleared or zeroed before the step (``zero_grad`` between backward and step,
  ``clip_grad_norm_`` with ``max_norm=0``): an optimizer about to step with every ``.grad``
  None, or (after a recorded pass, on the CPU, read one by one until one is not zero; on a
  device not at all: a read would wait for it) exactly zero, though a backward pass reached
  their modules since its last step. Each said once a run.

``Diagnosis`` tells it of parameters frozen or unfrozen (``retrained``): the modules are sorted
by the optimizers again at their next step. Nothing per module call.
"""

from __future__ import annotations

import weakref
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from typing import cast

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.optimizer_view import Held, OptimizerView, sort_held
from hooktrace.observe.optsteps import OptimizerSteps
from hooktrace.observe.stats import on_host


class Optimizers(Observer):
    """Signals of the optimizers' steps; PyTorch calls its step hooks directly: they never
    raise into the program, they switch it off."""

    follows = ()  # no module call: first sights, top-level calls and passes only

    def __init__(self, emit: Emit, uncalled: dict[ModInfo, None] | None = None) -> None:
        self._emit = emit
        #: every module with parameters, and id(trainable parameter) -> its module
        self.modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []
        self.owner: dict[int, ModInfo] = {}
        self._view = OptimizerView(emit, self.owner, {} if uncalled is None else uncalled)
        self._steps = OptimizerSteps(emit, self.owner)
        self._step = 0
        self._last_pass = -1  # the step of the last backward pass that ended
        self._recorded_pass = False  # the last backward pass was in a recorded step
        self._passes: dict[int, int] = {}  # per model, the passes that reached it
        self._pass_count = 0
        self._last_reached: dict[int, int] = {}  # per model, the last pass that reached it
        # per optimizer, the passes done when it last stepped
        self._stepped_after: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary())
        self._held = Held()  # the parameters of the optimizers that stepped
        self._held_changed = False
        self._seen_since_sort = False  # a module with parameters first seen since then
        self._sorted: dict[int, dict[str, list[str]]] = {}  # model -> its last optimizers signal
        # id(p) -> its .grad as an optimizer step left it, that tensor's version then, and the
        # passes that had reached its model then. Three flat dicts, no tuple: these live a whole
        # step, and the garbage collector walks (and promotes) each container that does
        self._stepped_grad: dict[int, weakref.ref[torch.Tensor]] = {}
        self._stepped_version: dict[int, int] = {}
        self._stepped_passes: dict[int, int] = {}
        self._said: set[str] = set()  # the kinds said once a run
        self._off = False  # an optimizer step raised here: its signals go quiet

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if module._parameters:
            self.modules.append((weakref.ref(module), info))
            self._seen_since_sort = True
        self.retrained(module, info, changed=False)

    def retrained(self, module: nn.Module, info: ModInfo, changed: bool = True) -> None:
        """A module whose parameters require a gradient now: its own, known as its; where its
        trainable count ``changed``, the modules sorted by the optimizers again."""
        self._held_changed = self._held_changed or changed
        for p in module._parameters.values():
            if p is not None and p.requires_grad:
                self.owner[id(p)] = info

    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        self._step = step

    def backward_end(self, end: PassEnd) -> None:
        self._step = self._last_pass = end.step
        self._recorded_pass = end.mode is Mode.RECORDED
        if self._recorded_pass:
            self._sort_modules(end.step, new=True)
        self._pass_count += 1
        for model in {info.model for info in end.reached}:
            self._passes[model] = self._passes.get(model, 0) + 1
            self._last_reached[model] = self._pass_count

    # -- optimizer steps -----------------------------------------------------------------------
    def optimizer_stepping(self, step: OptimizerStep) -> None:
        """Before a step: a parameter whose ``.grad`` is still the tensor the previous step
        left, added to since by each pass that reached its model (one version each) and never
        reset (set to None, or zeroed: one version more), carries the previous step's gradient
        into this one."""
        if self._off:
            return
        optimizer, args, kwargs = step
        try:
            params = optimizer_params(optimizer)
            # the hook's args start with the optimizer itself; a closure (or None) comes after
            closure = any(a is not None for a in args[1:]) or kwargs.get("closure") is not None
            self._steps.stepping(optimizer, params, self._step, self._last_pass, closure)
            said = self._said
            if SignalKind.GRADS_CLEARED not in said and params and all(
                    p.grad is None for p in params):
                self._say(SignalKind.GRADS_CLEARED, optimizer, params)
            if SignalKind.GRADS_ZEROED not in said and self._recorded_pass:
                self._zeroed_before_step(optimizer, params)
            if SignalKind.GRADS_CARRIED_OVER not in said:
                self._carried(params)
        except Exception:  # never into the program: these signals go quiet instead
            self._off = True

    def _carried(self, params: list[torch.Tensor]) -> None:
        carried: dict[int, dict[str, None]] = {}
        grads: list[torch.Tensor | None] = [p.grad for p in params]
        left = [None if ref is None else ref()
                for ref in map(self._stepped_grad.get, map(id, params))]
        # one look per parameter, in C: the .grad that is the tensor the last step left
        for p, grad in compress(zip(params, grads, strict=True), map(is_, left, grads)):
            if grad is not None:
                info = self.owner[id(p)]
                added = self._passes.get(info.model, 0) - self._stepped_passes[id(p)]
                if added and grad._version == self._stepped_version[id(p)] + added:
                    carried.setdefault(info.model, {})[info.fqn] = None
        for model, names in sorted(carried.items()):
            self._said.add(SignalKind.GRADS_CARRIED_OVER)
            self._emit(schema.Signal(self._step, model, "", SignalKind.GRADS_CARRIED_OVER,
                                     {"modules": list(names)}))

    def _say(self, kind: str, optimizer: torch.optim.Optimizer,
             params: list[torch.Tensor]) -> None:
        """``kind``, per model whose modules of ``params`` a backward pass reached since the
        optimizer's last step (those modules)."""
        since = self._stepped_after.get(optimizer, 0)
        reached: dict[int, dict[str, None]] = {}
        for p in params:
            info = self.owner.get(id(p))
            if info is not None and self._last_reached.get(info.model, 0) > since:
                reached.setdefault(info.model, {})[info.fqn] = None
        for model, names in sorted(reached.items()):
            self._said.add(kind)
            self._emit(schema.Signal(self._step, model, "", kind, {"modules": list(names)}))

    def _zeroed_before_step(self, optimizer: torch.optim.Optimizer,
                            params: list[torch.Tensor]) -> None:
        """An optimizer about to step with every ``.grad`` there is exactly zero. Whether that
        backward made them non-zero, the ``params`` record of the step tells the checker."""
        params = [p for p in params if p.grad is not None]
        grads = [g for g in (p.grad for p in params) if g is not None]
        if (not grads or not all(map(is_, map(type, grads), repeat(torch.Tensor)))
                or any(map(_is_sparse, grads))):
            return  # none, or a DTensor's or a sparse one: not read here
        if all_zero(grads):
            self._say(SignalKind.GRADS_ZEROED, optimizer, params)

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if self._off:
            return
        optimizer = step.optimizer
        try:
            self._stepped_after[optimizer] = self._pass_count
            params = optimizer_params(optimizer)
            keys = list(map(id, params))
            if self._held.stepped(params, keys):
                self._held_changed = True
            if self._steps.stepped(optimizer, params, self._step) and self._view.first(
                    optimizer, params, self._step):
                self._held_changed = True
            if SignalKind.GRADS_CARRIED_OVER not in self._said:  # then nothing more to keep
                self._keep_grads(params, keys)
            self._sort_modules(self._step)
        except Exception:
            self._off = True

    def _keep_grads(self, params: list[torch.Tensor], keys: list[int]) -> None:
        """What the step leaves of each parameter's ``.grad`` that a module owns: the tensor, its
        version, the passes that had reached its model. Per parameter in C where every one has
        a ``.grad`` and an owner (a Python loop over 400 W1 parameters costs a recorded step
        about 1%); else one by one."""
        grads = [p.grad for p in params]
        infos = list(map(self.owner.get, keys))
        if all(map(is_not, grads, repeat(None))) and all(map(is_not, infos, repeat(None))):
            self._stepped_grad.update(zip(keys, map(weakref.ref, cast(_Tensors, grads)),
                                          strict=True))
            self._stepped_version.update(zip(keys, map(_version, grads), strict=True))
            self._stepped_passes.update(zip(
                keys, map(self._passes.get, map(_model, infos), repeat(0)), strict=True))
            return
        for key, grad, info in zip(keys, grads, infos, strict=True):
            if grad is not None and info is not None:
                self._stepped_grad[key] = weakref.ref(grad)
                self._stepped_version[key] = grad._version
                self._stepped_passes[key] = self._passes.get(info.model, 0)

    def stop(self, step: int, mode: Mode) -> None:
        self._sort_modules(step, new=True)
        self._steps.stop()

    def _sort_modules(self, step: int, new: bool = False) -> None:
        """Once optimizers have stepped with parameters not seen before (``new``: or modules
        with parameters were first called since the last sort, an EMA copy validated between
        steps, while it lives): the ``optimizers`` signal of each model where it changed."""
        if not (self._held_changed or (new and self._held and self._seen_since_sort)):
            return
        self._held_changed = self._seen_since_sort = False
        held = self._held.among(self._stepped_after.keys())
        for model, detail in sort_held(self.modules, held, self._view.outside).items():
            if self._sorted.get(model) != detail:
                self._sorted[model] = detail
                self._emit(schema.Signal(step, model, "", SignalKind.OPTIMIZERS, detail))


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def all_zero(grads: list[torch.Tensor]) -> bool:
    """Tensor by tensor until one is not zero, the last layers' first (the likeliest to be
    non-zero), where that reads no device (``stats.on_host``); elsewhere not checked: a read per
    optimizer step would wait for the device (weights-unchanged tells the same bug there)."""
    return on_host(grads) and not any(g.any() for g in reversed(grads))


_Tensors = list[torch.Tensor]
_version = attrgetter("_version")
_model = attrgetter("model")
_is_sparse = attrgetter("is_sparse")

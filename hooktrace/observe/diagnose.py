"""An observer of the training loop around the modules: it writes ``signal`` and ``source`` records.

What it sees, and what it costs (paid at first sight of a module, or once per step, never per
module call):

* where each module class defines ``forward`` (once per class, not torch's own classes);
* a deprecated ``register_backward_hook`` hook on a module whose forward is more than one op
  (a module with submodules, or a class of the user's);
* a backward pass that reaches a model in eval mode (once per pass: the entry module's flag);
* a BatchNorm without trainable parameters in train mode while its model trains (first pass);
* gradients left uncleared: PyTorch's global optimizer step hooks tell whether an optimizer
  steps with a ``.grad`` that is still the tensor its previous step left, one version on for
  each backward pass that reached its model since (each adds to it once) and never reset
  (a GAN's discriminator, whose gradients the generator's backward adds to and the next
  ``zero_grad`` clears, is fine). A hook per parameter would tell it too, at 29 us a
  parameter a step (W1: 11 ms a step);
* parameters no optimizer holds: PyTorch's global optimizer step hook keeps the parameters of
  every optimizer that steps; when one steps with parameters not seen before, each model's
  modules are sorted by it (a signal when that changes);
* gradients zeroed before the step (``clip_grad_norm_`` with ``max_norm=0``, ``zero_grad``
  between backward and step): after a recorded pass, until said once, an optimizer about to
  step with every ``.grad`` exactly zero. On CPU the ``.grad`` are read one by one until one is
  not zero (the first, in a healthy run); on a device not at all (a read would wait for it);
* a parameter created in ``forward`` (``self.scale = nn.Parameter(...)`` at every call): at
  the end of each recorded step, the ids of each module's own parameters, summed into one int
  per module, against the last step's (a walk of the modules, no object kept per step); a
  trainable parameter whose object changed at two recorded steps in a row is said;
* each optimizer's steps (``optsteps``): after which backward pass, at which learning rate,
  holding which modules; said when tracing stops;
* what an optimizer holds against what the model is (``optimizer_view``): at its first step,
  Parameters over one storage and parameters of no named module; at each step, whether it
  steps again with the gradients its last step applied;
* parameters frozen or unfrozen during the run (``requires_grad_`` in an evaluation helper, a
  freeze schedule): in the same walk, each module's count of trainable own parameters against
  the last recorded step's (an int per module); a change is said once per model and step, and
  the modules are sorted by the optimizers again at their next step.
"""

from __future__ import annotations

import weakref
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from typing import Any, cast

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.hooks.sites import forward_site
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.aliases import other_names
from hooktrace.observe.optimizer_view import Held, OptimizerView, sort_held
from hooktrace.observe.optsteps import OptimizerSteps
from hooktrace.observe.paramlooks import all_zero, ids_sum, optimizer_params, trainable_count


class Diagnosis(Observer):
    """Signals of the training loop; PyTorch calls two of its hooks directly (optimizer steps,
    gradient accumulation): those never raise into the program, they switch it off."""

    follows = ()  # no module call: first sights, top-level calls and passes only

    def __init__(self, emit: Emit, uncalled: dict[ModInfo, None] | None = None) -> None:
        self._emit = emit
        self._classes: set[type] = set()
        self._entries: dict[int, weakref.ref[nn.Module]] = {}  # model -> its last entry module
        self._in_eval: set[int] = set()  # models reported running backward in eval mode
        # models a backward reached in this pass (a watched step follows model calls' only)
        self._models_reached: set[int] = set()
        self._passes: dict[int, int] = {}  # per model, the passes that reached it
        self._modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []  # with parameters
        self._owner: dict[int, ModInfo] = {}  # id(parameter) -> its module
        self._view = OptimizerView(emit, self._owner, {} if uncalled is None else uncalled)
        self._steps = OptimizerSteps(emit, self._owner)
        self._last_pass = -1  # the step of the last backward pass that ended
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
        self._reported_carry = False
        self._reported_cleared = False
        self._pass_count = 0
        self._last_reached: dict[int, int] = {}  # per model, the last pass that reached it
        # per optimizer, the passes done when it last stepped
        self._stepped_after: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary())
        self._bn_checked = False
        self._reported_zeroed = False
        self._recorded_pass = False  # the last backward pass was in a recorded step
        # every module seen, and the sum of the ids of its own parameters at the last recorded
        # step's end (-1 once said): ints, which the garbage collector does not track
        self._seen: list[ModInfo] = []
        self._param_ids: list[int] = []
        self._trainable: list[int] = []  # how many of its own parameters require a gradient
        self._prune_at = 64  # how many may be listed before the dead ones are dropped
        self._looks = 0  # recorded steps whose end looked at them
        # modules whose parameters changed at a look: that step, the look, ids by trainable name
        self._changed: dict[ModInfo, tuple[int, int, dict[str, int]]] = {}
        self._steps_off = False  # an optimizer step raised here: its signals go quiet
        self._step = 0

    # -- first sight -----------------------------------------------------------------------
    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        cls = type(module)
        if cls not in self._classes:
            self._classes.add(cls)
            self._source(cls)
        if module._backward_hooks and module._is_full_backward_hook is False and (
                module._modules or not cls.__module__.startswith("torch.")):
            for hook in list(module._backward_hooks.values()):
                self._emit(schema.Signal(
                    self._step, info.model, info.fqn, SignalKind.BACKWARD_HOOK,
                    {"hook": getattr(hook, "__qualname__", repr(hook))}))
        self._seen.append(info)
        self._param_ids.append(ids_sum(module))
        # as its module record has it: a freeze between naming and the first call (inside the
        # first forward) is a change the next recorded step's end reports
        self._trainable.append(info.trainable if info.has_params else trainable_count(module))
        if len(self._seen) > self._prune_at:  # modules made in forward come and go
            self._prune()
            self._prune_at = 2 * len(self._seen) + 64
        trainable = [p for p in module._parameters.values() if p is not None and p.requires_grad]
        if module._parameters:
            self._modules.append((weakref.ref(module), info))
            self._seen_since_sort = True
        for p in trainable:
            self._owner[id(p)] = info

    def _source(self, cls: type) -> None:
        site = forward_site(cls)
        if site is not None:
            self._emit(schema.Source(cls.__name__, *site))

    # -- the loop ----------------------------------------------------------------------------
    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        self._entries[info.model] = weakref.ref(module)
        self._step = step

    def backward_end(self, end: PassEnd) -> None:
        self._models_reached = set(map(_model, end.reached))
        self._step = self._last_pass = end.step
        self._recorded_pass = end.mode is Mode.RECORDED
        if self._recorded_pass:
            self._new_parameters(end.step)
            self._sort_modules(end.step, new=True)
        for model in self._models_reached:
            entry = self._entries.get(model)
            module = entry() if entry is not None else None
            if module is None:
                continue
            if module.training:
                self._in_eval.discard(model)
            elif model not in self._in_eval:
                self._in_eval.add(model)
                self._emit(schema.Signal(end.step, model, "", SignalKind.EVAL_BACKWARD))
        if self._models_reached and not self._bn_checked:
            self._bn_checked = True
            self._frozen_batchnorms(end.step)
        passes = self._passes
        self._pass_count += 1
        for model in self._models_reached:
            passes[model] = passes.get(model, 0) + 1
            self._last_reached[model] = self._pass_count
        self._models_reached.clear()

    def _frozen_batchnorms(self, step: int) -> None:
        for ref, info in self._modules:
            m = ref()
            if (isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                    and m.track_running_stats and info.model in self._models_reached
                    and not any(p.requires_grad for p in m.parameters(recurse=False))):
                self._emit(schema.Signal(step, info.model, info.fqn,
                                         SignalKind.FROZEN_BN_TRAINING))

    def _new_parameters(self, step: int) -> None:
        """Modules whose own parameters are other objects than at the last recorded step's end;
        said when a trainable one changed at two such ends in a row (once is a layer swapped or
        built lazily at its first call)."""
        self._looks += 1
        seen, ids, counts = self._seen, self._param_ids, self._trainable
        modules = [info.ref() for info in seen]
        now = [_GONE if m is None else sum(map(id, m._parameters.values())) for m in modules]
        trainable = [0 if m is None else trainable_count(m) for m in modules]
        if now == ids and trainable == counts:  # the usual case: two comparisons in C
            return
        gone = False
        changed: dict[int, dict[str, Any]] = {}  # per model: frozen, unfrozen modules
        for i, info in enumerate(seen):
            module = modules[i]
            if module is None:
                gone = True
                continue
            if ids[i] != -1 and now[i] != ids[i]:
                ids[i] = now[i]
                if self._changed_again(step, info, module):
                    ids[i] = -1
            if (count := trainable[i]) != counts[i]:
                key = "frozen" if count < counts[i] else "unfrozen"
                changed.setdefault(info.model, {"frozen": [], "unfrozen": []})[key].append(
                    info.fqn)
                counts[i] = count
                self._adopt(module, info)
        for model, detail in sorted(changed.items()):
            self._held_changed = True  # sort the modules by the optimizers again
            detail.update(other_names(self._entries.get(model), detail["frozen"]))
            self._emit(schema.Signal(step, model, "", SignalKind.TRAINABLE_CHANGED, detail))
        if gone:
            self._prune()

    def _adopt(self, module: nn.Module, info: ModInfo) -> None:
        """A module whose parameters now require a gradient: its own, known as its."""
        for p in module._parameters.values():
            if p is not None and p.requires_grad:
                self._owner[id(p)] = info

    def _prune(self) -> None:
        seen, ids, counts = self._seen, self._param_ids, self._trainable
        kept = [i for i, info in enumerate(seen) if info.ref() is not None]
        self._seen = [seen[i] for i in kept]
        self._param_ids = [ids[i] for i in kept]
        self._trainable = [counts[i] for i in kept]

    def _changed_again(self, step: int, info: ModInfo, module: nn.Module) -> bool:
        now = {name: id(p) for name, p in module._parameters.items()
               if p is not None and p.requires_grad}
        before = self._changed.get(info)
        if before is None or before[1] != self._looks - 1:
            self._changed[info] = (step, self._looks, now)
            return False
        first, _, then = before
        new = [name for name, ident in now.items() if then.get(name) != ident]
        if not new:
            self._changed[info] = (first, self._looks, now)
            return False
        del self._changed[info]
        self._emit(schema.Signal(first, info.model, info.fqn, SignalKind.PARAMS_RECREATED,
                                 {"params": new}))
        return True

    def optimizer_stepping(self, step: OptimizerStep) -> None:
        """Before a step: a parameter whose ``.grad`` is still the tensor the previous step
        left, added to since by each pass that reached its model (one version each) and never
        reset (set to None, or zeroed: one version more), carries the previous step's gradient
        into this one. Said once a run."""
        if self._steps_off:
            return
        optimizer = step.optimizer
        try:
            params = optimizer_params(optimizer)
            self._view.stepping(optimizer, params, step.args, step.kwargs, self._step)
            self._steps.stepping(optimizer, params, self._last_pass)
            if not self._reported_cleared:
                self._cleared_before_step(optimizer, params)
            if not self._reported_zeroed and self._recorded_pass:
                self._zeroed_before_step(optimizer, params)
            if self._reported_carry:
                return
            carried: dict[int, dict[str, None]] = {}
            grads: list[torch.Tensor | None] = [p.grad for p in params]
            left = [None if ref is None else ref()
                    for ref in map(self._stepped_grad.get, map(id, params))]
            # one look per parameter, in C: the .grad that is the tensor the last step left
            for p, grad in compress(zip(params, grads, strict=True), map(is_, left, grads)):
                if grad is not None:
                    info = self._owner[id(p)]
                    added = self._passes.get(info.model, 0) - self._stepped_passes[id(p)]
                    if added and grad._version == self._stepped_version[id(p)] + added:
                        carried.setdefault(info.model, {})[info.fqn] = None
            for model, names in sorted(carried.items()):
                self._reported_carry = True
                self._emit(schema.Signal(self._step, model, "", SignalKind.GRADS_CARRIED_OVER,
                                         {"modules": list(names)}))
        except Exception:  # never into the program: these signals go quiet instead
            self._steps_off = True

    def _cleared_before_step(self, optimizer: torch.optim.Optimizer,
                             params: list[torch.Tensor]) -> None:
        """An optimizer about to step with every ``.grad`` None, though a backward pass reached
        its parameters' modules since its last step: the gradients were cleared in between."""
        if not params or any(p.grad is not None for p in params):
            return
        for model, names in self._reached(optimizer, params):
            self._reported_cleared = True
            self._emit(schema.Signal(self._step, model, "", SignalKind.GRADS_CLEARED,
                                     {"modules": names}))

    def _reached(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
                 ) -> list[tuple[int, list[str]]]:
        """Per model, the modules of ``params`` a backward pass reached since the optimizer's
        last step."""
        since = self._stepped_after.get(optimizer, 0)
        reached: dict[int, dict[str, None]] = {}
        for p in params:
            info = self._owner.get(id(p))
            if info is not None and self._last_reached.get(info.model, 0) > since:
                reached.setdefault(info.model, {})[info.fqn] = None
        return [(model, list(names)) for model, names in sorted(reached.items())]

    def _zeroed_before_step(self, optimizer: torch.optim.Optimizer,
                            params: list[torch.Tensor]) -> None:
        """An optimizer about to step with every ``.grad`` there is exactly zero, after a
        backward pass reached their modules: zeroed in between (``clip_grad_norm_`` with
        ``max_norm=0``, ``zero_grad(set_to_none=False)``). Whether that backward made them
        non-zero, the ``params`` record of the step tells the checker."""
        params = [p for p in params if p.grad is not None]
        grads = [g for g in (p.grad for p in params) if g is not None]
        if (not grads or not all(map(is_, map(type, grads), repeat(torch.Tensor)))
                or any(map(_is_sparse, grads))):
            return  # none, or a DTensor's or a sparse one: not read here
        if not all_zero(grads):
            return
        for model, names in self._reached(optimizer, params):
            self._reported_zeroed = True
            self._emit(schema.Signal(self._step, model, "", SignalKind.GRADS_ZEROED,
                                     {"modules": names}))

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if self._steps_off:
            return
        optimizer = step.optimizer
        try:
            self._stepped_after[optimizer] = self._pass_count
            params = optimizer_params(optimizer)
            keys = list(map(id, params))
            if self._held.stepped(params, keys):
                self._held_changed = True
            if self._view.stepped(optimizer, params, self._step):
                self._held_changed = True
            if not self._reported_carry:  # said once a run: then nothing more to keep
                self._keep_grads(params, keys)
            self._sort_modules(self._step)
        except Exception:
            self._steps_off = True

    def _keep_grads(self, params: list[torch.Tensor], keys: list[int]) -> None:
        """What the step leaves of each parameter's ``.grad`` that a module owns: the tensor, its
        version, the passes that had reached its model. Per parameter in C where every one has
        a ``.grad`` and an owner (a Python loop over 400 W1 parameters costs a recorded step
        about 1%); else one by one."""
        grads = [p.grad for p in params]
        infos = list(map(self._owner.get, keys))
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
        self._view.stop(step)
        self._steps.stop()

    def _sort_modules(self, step: int, new: bool = False) -> None:
        """Once optimizers have stepped with parameters not seen before (``new``: or modules
        with parameters were first called since the last sort, an EMA copy validated between
        steps, while it lives): the ``optimizers`` signal of each model where it changed."""
        if not (self._held_changed or (new and self._held and self._seen_since_sort)):
            return
        self._held_changed = self._seen_since_sort = False
        held = self._held.among(self._stepped_after.keys())
        for model, detail in sort_held(self._modules, held, self._view.outside).items():
            if self._sorted.get(model) != detail:
                self._sorted[model] = detail
                self._emit(schema.Signal(step, model, "", SignalKind.OPTIMIZERS, detail))

_Tensors = list[torch.Tensor]
_GONE = -2  # a dead module's ids sum at a look (-1: said)
_version = attrgetter("_version")
_model = attrgetter("model")
_is_sparse = attrgetter("is_sparse")

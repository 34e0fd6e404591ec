"""An observer of the training loop around the modules: it writes ``signal`` and ``source`` records.

What it sees, and what it costs (paid at first sight of a module, or once per step, never per
module call):

* where each module class defines ``forward`` (once per class, not torch's own classes);
* a deprecated ``register_backward_hook`` hook on a module whose forward is more than one op
  (a module with submodules, or a class of the user's);
* a backward pass that reaches a model in eval mode (once per pass: the entry module's flag);
* a BatchNorm without trainable parameters in train mode while its model trains (first pass);
* a parameter created in ``forward`` (``self.scale = nn.Parameter(...)`` at every call): at
  the end of each recorded step, the ids of each module's own parameters, summed into one int
  per module, against the last step's (a walk of the modules, no object kept per step); a
  trainable parameter whose object changed at two recorded steps in a row is said;
* parameters frozen or unfrozen during the run (``requires_grad_`` in an evaluation helper, a
  freeze schedule): in the same walk, each module's count of trainable own parameters against
  the last recorded step's (an int per module); a change is said once per model and step, and
  the optimizers observer (``optimizers.py``, which follows the optimizer step) told; the other
  names the model holds a frozen module under (a target network that is the online network
  itself, not a copy of it: ``other_names``).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.hooks.sites import forward_site
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.optimizers import Optimizers


class Diagnosis(Observer):
    """Signals of the training loop around the modules."""

    follows = ()  # no module call: first sights, top-level calls and passes only

    def __init__(self, emit: Emit, optimizers: Optimizers) -> None:
        self._emit = emit
        self._optimizers = optimizers  # told of parameters frozen or unfrozen
        self._classes: set[type] = set()
        self._entries: dict[int, weakref.ref[nn.Module]] = {}  # model -> its last entry module
        self._in_eval: set[int] = set()  # models reported running backward in eval mode
        # models a backward reached in this pass (a watched step follows model calls' only)
        self._models_reached: set[int] = set()
        self._bn_checked = False
        # every module seen, and the sum of the ids of its own parameters at the last recorded
        # step's end (-1 once said): ints, which the garbage collector does not track
        self._seen: list[ModInfo] = []
        self._param_ids: list[int] = []
        self._trainable: list[int] = []  # how many of its own parameters require a gradient
        self._prune_at = 64  # how many may be listed before the dead ones are dropped
        self._looks = 0  # recorded steps whose end looked at them
        # modules whose parameters changed at a look: that step, the look, ids by trainable name
        self._changed: dict[ModInfo, tuple[int, int, dict[str, int]]] = {}
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
        self._param_ids.append(sum(map(id, module._parameters.values())))
        # as its module record has it: a freeze between naming and the first call (inside the
        # first forward) is a change the next recorded step's end reports
        self._trainable.append(info.trainable if info.has_params else trainable_count(module))
        if len(self._seen) > self._prune_at:  # modules made in forward come and go
            self._prune()
            self._prune_at = 2 * len(self._seen) + 64

    def _source(self, cls: type) -> None:
        site = forward_site(cls)
        if site is not None:
            self._emit(schema.Source(cls.__name__, *site))

    # -- the loop ----------------------------------------------------------------------------
    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        self._entries[info.model] = weakref.ref(module)
        self._step = step

    def backward_end(self, end: PassEnd) -> None:
        self._models_reached = {info.model for info in end.reached}
        self._step = end.step
        if end.mode is Mode.RECORDED:
            self._new_parameters(end.step)
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
        self._models_reached.clear()

    def _frozen_batchnorms(self, step: int) -> None:
        for ref, info in self._optimizers.modules:
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
                self._optimizers.retrained(module, info)
        for model, detail in sorted(changed.items()):
            detail.update(other_names(self._entries.get(model), detail["frozen"]))
            self._emit(schema.Signal(step, model, "", SignalKind.TRAINABLE_CHANGED, detail))
        if gone:
            self._prune()

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


_GONE = -2  # a dead module's ids sum at a look (-1: said)


def trainable_count(module: nn.Module) -> int:
    """How many of a module's own parameters require a gradient."""
    return sum(1 for p in module._parameters.values() if p is not None and p.requires_grad)


def other_names(entry: weakref.ref[nn.Module] | None, names: list[str]) -> dict[str, Any]:
    """``{"aliases": ...}``, per fqn of ``names`` (frozen modules under the model's entry
    module) that the model also holds under other names: those, in ``named_modules`` order;
    ``{}`` where there is none. Asked only when a freeze is seen: it walks the whole tree."""
    root = entry() if entry is not None and names else None
    if root is None:
        return {}
    paths: dict[int, list[str]] = {}  # ids are stable here: every module of the tree is alive
    for name, module in root.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(name)
    held = {name: found for found in paths.values() if len(found) > 1 for name in found}
    aliases = {name: [other for other in held[name] if other != name]
               for name in names if name in held}
    return {"aliases": aliases} if aliases else {}

"""The parameter ledger: per trainable parameter, whether it moved between looks and what the
optimizer steps between held of it (``params-unmoved``); per model with float16 or bfloat16
weights, how many of their sampled elements an update moved (``half-updates``); per optimizer,
its learning rates (``optimizer-lrs``, ``Lrs``). Their fields: ``log/signals.py``. Facts only:
``check`` says whether the weights train, and why not (``check/updates.py``).

Looks: at the end of each recorded step's backward pass and of the watched steps numbered by a
power of two (16, 32, 64, ...: a layer frozen for the first epochs, as DINO freezes its last
layer, moves before the run's last look). At each, every trainable parameter with a gradient
not yet seen moving is fingerprinted (``bit_sums``: exact, one read); once it changed it is no
longer looked at. Gradients count as cleared between looks at a new ``.grad``, or one not added
to once a pass (a loop meant to train, not an analysis that sums gradients). Only where the
parameters are on the CPU (``stats.on_host``): on a device each read would wait for it.

Cost: one integer sum per parameter not yet moved at each look (none once all moved: the
second look in a run that trains); a gather of ``SAMPLE`` elements per half-precision parameter
at a few looks; at an optimizer step, a few floats of its groups and, while a parameter not yet
moved has been counted in fewer than ``_COUNTED`` steps, a ``.grad`` test of each and a
membership test in the stepping optimizer's groups; then nothing per step.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.lossvalues import Thinned
from hooktrace.observe.stats import on_host

_SHOWN = 20  # parameters listed per model, at most
_COUNTED = 16  # optimizer steps counted per parameter: enough to say why it does not move
_LOOKS = 64  # looks kept per model
SAMPLE = 64  # elements per half-precision parameter
_COMPARED = 8  # comparisons of a model's half-precision samples, at most
_HALF = (torch.float16, torch.bfloat16)
#: the integer type of each element size: a float tensor's bits, summed as integers
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_sums(params: list[torch.Tensor]) -> list[int]:
    """Per tensor, the sum of its elements' bit patterns, wrapped at their width: two states
    that differ in one element always differ here (two distinct values of n bits differ by less
    than 2**n), read at once. Exact where a float norm rounds, and a sixth of a float64 norm's
    cost. A NaN that stays NaN is unchanged here; NaN weights are check's other findings'."""
    sums = []
    for p in params:
        data = p.detach()
        if data.is_complex():
            data = torch.view_as_real(data)
        sums.append(data.view(BITS[data.element_size()]).sum(dtype=BITS[data.element_size()]))
    device = sums[0].device
    return torch.stack([s.to(device) for s in sums]).tolist()


#: optimizers whose weight decay multiplies each weight by 1 - lr * weight_decay (and any group
#: with ``decoupled_weight_decay``); Adam's coupled decay is scaled by its normalisation
_SHRINKING = {"SGD", "AdamW"}


class Lrs:
    """One optimizer's learning rates so far (kept past the optimizer: a training function's
    optimizer is gone when tracing stops). A long run keeps a bounded sample, evenly spread, the
    last step always kept (``lossvalues.Thinned``); a tensor lr (capturable) is not read."""

    def __init__(self, optimizer: torch.optim.Optimizer, models: list[int]) -> None:
        self.cls = type(optimizer).__name__
        self.models = models  # those its parameters belong to, at its first step
        #: the backward pass each step came after, and the largest numeric lr of its groups
        #: (None: none)
        self.lrs = Thinned()
        self.decay: dict[str, Any] | None = None  # the largest lr x weight_decay, where first

    def stepped(self, optimizer: torch.optim.Optimizer, after: int) -> None:
        groups = optimizer.param_groups
        numbers = [float(g["lr"]) for g in groups if isinstance(g.get("lr"), (int, float))]
        lr = max(numbers) if numbers else None
        self.lrs.add(after, lr)
        shrinking = self.cls in _SHRINKING
        for g in groups:
            lr_g, wd = g.get("lr"), g.get("weight_decay")
            if (shrinking or g.get("decoupled_weight_decay")) and isinstance(
                    lr_g, (int, float)) and isinstance(wd, (int, float)) and lr_g * wd > (
                    self.decay["lr"] * self.decay["weight_decay"] if self.decay else 0):
                self.decay = {"step": after, "lr": float(lr_g), "weight_decay": float(wd)}

    def detail(self) -> dict[str, Any]:
        after, lr = self.lrs.pairs()
        detail: dict[str, Any] = {"optimizer": self.cls, "models": self.models,
                                  "count": self.lrs.count, "every": self.lrs.every,
                                  "after": after, "lr": lr}
        if self.decay is not None:
            detail["decay"] = self.decay
        return detail


class _Entry:
    """One parameter not moved yet: its first and last looks and the optimizer steps since."""

    __slots__ = ("ref", "model", "name", "bits", "step", "through", "steps", "held", "grads",
                 "dtype")

    def __init__(self, p: torch.Tensor, info: ModInfo, name: str, bits: int, step: int) -> None:
        self.ref, self.model, self.bits, self.step = weakref.ref(p), info.model, bits, step
        self.name = f"{info.fqn}.{name}" if info.fqn else name
        self.through = step
        self.steps = self.held = self.grads = 0  # steps; held by its optimizer; with a .grad
        self.dtype = str(p.dtype).removeprefix("torch.")


class _Sample:
    """A model's sampled half-precision weights at a look, before their update."""

    __slots__ = ("step", "params", "indices", "values", "moving", "stepped")

    def __init__(self, step: int, params: list[torch.Tensor], stepped: int) -> None:
        self.step, self.params, self.stepped = step, params, stepped  # stepped: optimizer steps
        self.indices = [spread(p.numel(), SAMPLE) for p in params]
        self.values = [p.detach().reshape(-1)[i].clone()
                       for p, i in zip(params, self.indices, strict=True)]
        # the sampled elements whose gradient is not zero: those an update must move
        self.moving = [p.grad.reshape(-1)[i] != 0 for p, i in  # type: ignore[union-attr]
                       zip(params, self.indices, strict=True)]

    def changed(self) -> tuple[int, int]:
        """(elements that moved, elements that should have) since the sample was taken."""
        moved = should = 0
        for p, i, before, moving in zip(self.params, self.indices, self.values, self.moving,
                                        strict=True):
            should += int(moving.sum())
            moved += int(((p.detach().reshape(-1)[i] != before) & moving).sum())
        return moved, should


def spread(n: int, most: int) -> torch.Tensor:
    """Up to ``most`` positions spread evenly over a tensor of ``n`` elements."""
    k = min(n, most)
    return torch.arange(k) * (n - 1) // max(k - 1, 1)  # distinct: n - 1 >= k - 1


class _Model:
    """A model's looks while some of its parameters had not moved, and its half-precision
    samples compared."""

    __slots__ = ("looks", "moved", "cleared", "grad", "sample", "compared", "dtype")

    def __init__(self) -> None:
        self.looks: list[list[int]] = []  # [step, passes an optimizer stepped after, so far]
        self.moved = 0  # its parameters seen moving
        self.cleared = False  # its gradients were cleared between two looks
        self.grad: tuple[weakref.ref[Any], weakref.ref[Any], int, int] | None = None
        self.sample: _Sample | None = None
        self.compared: list[list[int]] = []  # [sample's step, step, moved, should have]
        self.dtype = ""

    def look(self, step: int, stepping: int, p: torch.Tensor) -> None:
        """A look at which ``p``, its first parameter found, had not moved."""
        if len(self.looks) < _LOOKS:
            self.looks.append([step, stepping])
        grad = p.grad
        if grad is None:  # only parameters with a gradient are looked at
            return
        last, version = self.grad, grad._version
        if last is not None and last[0]() is p and (
                last[1]() is not grad or version != last[2] + step - last[3]):
            self.cleared = True
        self.grad = (weakref.ref(p), weakref.ref(grad), version, step)


class ParamLedger(Observer):
    """Writes the parameter ledger's facts when tracing stops (``params-unmoved``,
    ``half-updates``, ``optimizer-lrs``)."""

    follows = ()  # no module call: passes and optimizer steps only

    def __init__(self, emit: Emit, modules: list[tuple[weakref.ref[nn.Module], ModInfo]]) -> None:
        self._emit = emit
        self._modules = modules  # the optimizers observer's: every module with parameters
        self._unmoved: dict[int, _Entry] = {}  # id(parameter) -> its entry
        self._moved: set[int] = set()
        self._models: dict[int, _Model] = {}
        self._lrs: weakref.WeakKeyDictionary[torch.optim.Optimizer, Lrs] = (
            weakref.WeakKeyDictionary())
        self._all_lrs: list[Lrs] = []  # kept past their optimizers
        self._after = -1  # the last pass that ended: an optimizer step now comes after it
        self._steps = 0  # optimizer steps so far
        self._stepping = 0  # passes an optimizer stepped after, so far
        self._stepped_after: int | None = None
        self._counting = False  # some entry is counted in fewer than _COUNTED steps
        self._off = self._lrs_off = False

    def backward_end(self, end: PassEnd) -> None:
        self._after = end.step
        watched_look = end.step >= 16 and end.step & (end.step - 1) == 0
        if self._off or not (end.mode is Mode.RECORDED or watched_look):
            return
        try:
            self._look(end.step)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._off = True
            self._unmoved.clear()
            self._models.clear()

    def _model(self, model: int) -> _Model:
        found = self._models.get(model)
        if found is None:
            found = self._models[model] = _Model()
        return found

    def _look(self, step: int) -> None:
        found: list[tuple[int, torch.Tensor, ModInfo, str]] = []
        half: dict[int, list[torch.Tensor]] = {}
        for ref, info in self._modules:
            module = ref() if info.ref() is not None else None  # None: adopted by a later model
            if module is None or not info.has_params:
                continue
            # an embedding's half-precision weights are not sampled: a sparse update moves only
            # the rows looked up
            sampled = "Embedding" not in type(module).__name__
            for name, p in module._parameters.items():
                if p is None or not p.requires_grad or p.grad is None:
                    continue
                if id(p) not in self._moved:
                    found.append((id(p), p, info, name))
                if sampled and p.dtype in _HALF and not p.grad.is_sparse and p.numel() and len(
                        self._model(info.model).compared) < _COMPARED:
                    half.setdefault(info.model, []).append(p)
        if found and on_host([f[1] for f in found]):
            self._fingerprint(step, found)
        for model, params in half.items():
            if on_host(params):
                self._compare(self._models[model], step, params)

    def _fingerprint(self, step: int, found: list[tuple[int, torch.Tensor, ModInfo, str]]
                     ) -> None:
        first: dict[int, torch.Tensor] = {}  # per model, its first parameter not moved
        for (key, p, info, name), bits in zip(found, bit_sums([f[1] for f in found]),
                                              strict=True):
            entry = self._unmoved.get(key)
            if entry is None or entry.ref() is not p:  # a first look (or a reused id)
                self._unmoved[key] = _Entry(p, info, name, bits, step)
                self._counting = True
            elif bits != entry.bits:
                self._moved.add(key)
                del self._unmoved[key]
                self._model(info.model).moved += 1
                continue
            else:
                entry.through = step
            first.setdefault(info.model, p)
        for model, p in first.items():
            self._model(model).look(step, self._stepping, p)

    def _compare(self, model: _Model, step: int, params: list[torch.Tensor]) -> None:
        sample = model.sample
        if sample is not None and self._steps > sample.stepped and len(
                sample.params) == len(params) and all(
                a is b for a, b in zip(sample.params, params, strict=True)):
            model.compared.append([sample.step, step, *sample.changed()])
            model.dtype = str(params[0].dtype).removeprefix("torch.")
        model.sample = (_Sample(step, params, self._steps)
                        if len(model.compared) < _COMPARED else None)

    def optimizer_stepping(self, step: OptimizerStep) -> None:
        if self._off or not self._counting:
            return
        held = {id(p) for group in step.optimizer.param_groups for p in group["params"]}
        for key, entry in self._unmoved.items():
            p = entry.ref()
            if p is None or key not in held or entry.steps >= _COUNTED:
                continue
            entry.held += 1
            entry.grads += p.grad is not None

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        self._steps += 1
        if self._stepped_after != self._after:
            self._stepping += 1
            self._stepped_after = self._after
        if not self._lrs_off:
            try:
                lrs = self._lrs.get(step.optimizer)
                if lrs is None:
                    lrs = self._lrs[step.optimizer] = Lrs(step.optimizer,
                                                          self._models_of(step.optimizer))
                    self._all_lrs.append(lrs)
                lrs.stepped(step.optimizer, self._after)
            except Exception:  # never into the program: the learning rates go quiet
                self._lrs_off = True
        if not self._counting:
            return
        for entry in self._unmoved.values():
            entry.steps = min(entry.steps + 1, _COUNTED)
        self._counting = any(e.steps < _COUNTED for e in self._unmoved.values())

    def _models_of(self, optimizer: torch.optim.Optimizer) -> list[int]:
        """The models whose parameters ``optimizer`` holds (once per optimizer)."""
        owner = {id(p): info.model for ref, info in self._modules if info.has_params
                 and (m := ref()) is not None for p in m._parameters.values() if p is not None}
        return sorted({owner[id(p)] for group in optimizer.param_groups
                       for p in group["params"] if id(p) in owner})

    def stop(self, step: int, mode: Mode) -> None:
        by_model: dict[int, list[_Entry]] = {}
        for entry in self._unmoved.values():
            if entry.through > entry.step:  # looked at twice: its model may be gone now
                by_model.setdefault(entry.model, []).append(entry)
        for index, entries in sorted(by_model.items()):
            model = self._model(index)
            params = [{"param": e.name, "since": e.step, "through": e.through, "steps": e.steps,
                       "held": e.held, "grads": e.grads}
                      for e in sorted(entries, key=lambda e: e.name)]
            self._emit(schema.Signal(min(e.step for e in entries), index, "",
                                     SignalKind.PARAMS_UNMOVED, {
                "params": params[:_SHOWN], "count": len(params),
                "modules": list(dict.fromkeys(e.name.rpartition(".")[0] for e in entries)),
                "dtypes": sorted({e.dtype for e in entries}), "moved": model.moved,
                "looks": model.looks, "cleared": model.cleared}))
        for index, model in sorted(self._models.items()):
            if model.compared:
                self._emit(schema.Signal(model.compared[0][0], index, "", SignalKind.HALF_UPDATES,
                                         {"dtype": model.dtype, "compared": model.compared}))
        for lrs in self._all_lrs:  # also one holding no model's parameters: it stepped
            self._emit(schema.Signal(max(lrs.lrs.keys[0], 0), (lrs.models or [0])[0], "",
                                     SignalKind.OPTIMIZER_LRS, lrs.detail()))
        self._unmoved.clear()
        self._models.clear()
        self._all_lrs.clear()

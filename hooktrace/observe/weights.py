"""Whether the weights train: an observer that tells a model whose weights never change.

"My loss does not go down" often means the weights never move: ``optimizer.step()`` forgotten,
a learning rate of 0, gradients zeroed before the step (``clip_grad_norm_`` with
``max_norm=0``, ``zero_grad(set_to_none=False)`` between ``backward`` and ``step``). Each
model's trainable parameters that got a gradient are fingerprinted at the end of a recorded
step's backward (per tensor, the sum of its elements' bits, wrapped at their width: a change
of one bit in one element changes it) and again at the next recorded steps. The model is
decided once:

* a fingerprint changed: it trains; nothing more is computed for it;
* unchanged after optimizer steps in two different steps since the first fingerprint (one
  step with a learning rate of 0 is a warmup's first): a ``weights-unchanged`` signal;
* unchanged through the run's recorded steps with no optimizer step at all, though the
  gradients were cleared between steps (a loop meant to train): the same signal, written when
  tracing stops (``detail.optimizer_steps`` 0). Weights changed by hand (no optimizer) change
  the fingerprint; gradients only added to, never cleared, are an analysis.

A learning rate that a schedule brings down to nothing early in the run (``StepLR`` meant per
epoch stepped per batch) is said too: per optimizer, its peak learning rate and the steps it
stepped with less than ``LR_FLOOR`` of it; when tracing stops, an optimizer that spent half
its steps or more there gets an ``lr-collapsed`` signal (a few floats per optimizer step, read
from its ``param_groups``; a schedule that ends near 0, as OneCycleLR and cosine do, spends
only its last steps there), as does one that got there by the same factor of a half or less at
each of three steps in a row or more (``StepLR(step_size=1)`` stepped per batch: a cosine or
a warmup never falls by one constant factor). And a weight decay that takes ``DECAY_SHRINK``
or more of every weight at each step (``weight_decay=5`` meant as 5e-4): where the step
multiplies each weight by ``1 - lr * weight_decay`` (SGD, AdamW and any decoupled decay; Adam's
coupled decay is scaled by its normalisation, not said), a ``weight-decay`` signal once per
optimizer.

Cost: one integer sum over the parameters per recorded step until the model is decided (two
steps in a run that trains; 4.8 ms for resnet18's 11M parameters, a sixth of a float64 norm),
one read each; nothing per module call, nothing in watched steps. Only
where the parameters are on the CPU (``stats.on_host``): on a device each read would wait for
it, and a step has one transfer, the statistics' (so a GPU run gets no such signal yet).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.stats import on_host

LR_FLOOR = 1e-4  # of the peak learning rate: updates this much smaller change next to nothing
#: a learning rate multiplied by the same factor, GEOMETRIC or less, at each of GEOMETRIC_RUN
#: optimizer steps in a row or more down to below LR_FLOOR: a per-epoch schedule per batch
GEOMETRIC = 0.5
GEOMETRIC_RUN = 3
DECAY_SHRINK = 0.01  # lr * weight_decay: 1% of every weight a step (SGD 0.1 x 5e-4: 5e-5)
_SHRINKING = {"SGD", "AdamW"}  # optimizers whose weight decay multiplies by 1 - lr * wd


class _Schedule:
    """An optimizer's learning rates so far: its peak, and its steps below ``LR_FLOOR`` of it."""

    __slots__ = ("models", "peak", "last", "steps", "low", "low_from", "decay_said", "ratio",
                 "run", "factor")

    def __init__(self, models: list[int]) -> None:
        self.models = models  # those its parameters belong to, at its first step
        self.peak = self.last = 0.0
        self.steps = self.low = 0
        self.low_from: int | None = None  # the run's step where it first fell there
        self.decay_said = False
        self.ratio = 0.0  # the last step's lr over the one before, where it fell by half or more
        self.run = 0  # steps in a row it fell by that same ratio
        self.factor = 0.0  # that ratio, where such a run brought it below the floor

    def stepped(self, lr: float, step: int) -> None:
        self.steps += 1
        if self.last > 0 and 0 < lr <= GEOMETRIC * self.last:
            ratio = lr / self.last
            same = self.ratio and abs(ratio - self.ratio) <= 1e-3 * self.ratio
            self.run, self.ratio = (self.run + 1 if same else 1), ratio
        else:
            self.run, self.ratio = 0, 0.0
        self.peak, self.last = max(self.peak, lr), lr
        if lr < LR_FLOOR * self.peak:
            self.low += 1
            if self.low_from is None:
                self.low_from = step
                if self.run >= GEOMETRIC_RUN:
                    self.factor = self.ratio


class _Baseline:
    """A model's first fingerprint, and what happened since."""

    __slots__ = ("step", "names", "params", "bits", "stepped_in", "lrs", "last_same",
                 "grad", "version", "cleared")

    def __init__(self, step: int, names: list[str], params: list[torch.Tensor],
                 bits: list[int]) -> None:
        self.step = step
        self.names = names  # the modules whose parameters are fingerprinted
        self.params = params
        self.bits = bits
        self.stepped_in: set[int] = set()  # steps in which an optimizer stepped since
        self.lrs: set[float] = set()  # their learning rates
        self.last_same = step  # the last step whose fingerprint was the same
        # the first parameter's .grad then, and its version: whether gradients were cleared
        # between steps (zero_grad: a loop meant to train), or only added to (an analysis)
        self.grad, self.version = _grad_state(params[0])
        self.cleared = False

    def look(self, step: int) -> None:
        """Another step with the same fingerprint; one pass since the last look."""
        grad, version = _grad_state(self.params[0])
        if grad() is not self.grad() or version != self.version + (step - self.last_same):
            self.cleared = True
        self.grad, self.version, self.last_same = grad, version, step


class WeightChange(Observer):
    """Writes a ``weights-unchanged`` signal for a model whose weights never change."""

    follows = ()  # no module call: first sights and passes only

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []  # with parameters
        self._baselines: dict[int, _Baseline] = {}
        self._decided: set[int] = set()
        self._optimizer_steps = 0
        self._step = 0
        self._off = False
        # per optimizer (and kept past it: a training function's optimizer is gone when
        # tracing stops)
        self._schedules: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Schedule] = (
            weakref.WeakKeyDictionary())
        self._all_schedules: list[_Schedule] = []
        self._steps_off = False  # a step raised here: the signal goes quiet

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._modules.append((weakref.ref(module), info))

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if self._steps_off:
            return
        optimizer = step.optimizer
        try:
            self._optimizer_steps += 1
            lrs = {g.get("lr") for g in optimizer.param_groups}
            numbers = [float(lr) for lr in lrs if isinstance(lr, (int, float))]
            if numbers:
                schedule = self._schedules.get(optimizer)
                if schedule is None:
                    schedule = self._schedules[optimizer] = _Schedule(self._models_of(optimizer))
                    self._all_schedules.append(schedule)
                schedule.stepped(max(numbers), max(self._step - 1, 0))  # the pass before
                if not schedule.decay_said:
                    self._decay(optimizer, schedule)
            for baseline in self._baselines.values():
                baseline.stepped_in.add(self._step)
                baseline.lrs.update(lr for lr in lrs if isinstance(lr, (int, float)))
        except Exception:  # never into the program: the signal goes quiet instead
            self._steps_off = True

    def backward_end(self, end: PassEnd) -> None:
        self._step = end.step + 1  # an optimizer step after this pass belongs to the next
        if end.mode is not Mode.RECORDED or self._off:
            return
        try:
            self._fingerprint(end.step)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._off = True
            self._baselines.clear()

    def _fingerprint(self, step: int) -> None:
        for model, (names, params) in self._models().items():
            if not params or not on_host(params):
                continue  # on a device a read would wait for it: not checked there
            baseline = self._baselines.get(model)
            if baseline is None or len(baseline.params) != len(params) or any(
                    a is not b for a, b in zip(baseline.params, params, strict=True)):
                self._baselines[model] = _Baseline(step, names, params, bit_sums(params))
                continue  # a first fingerprint, or one of other parameters
            if bit_sums(params) != baseline.bits:
                self._decided.add(model)  # it trains
                del self._baselines[model]
                continue
            baseline.look(step)
            if len(baseline.stepped_in) >= 2:
                self._decide(model, baseline)

    def _models(self) -> dict[int, tuple[list[str], list[torch.Tensor]]]:
        """Per model not decided yet, the modules and trainable parameters that have a
        gradient now."""
        out: dict[int, tuple[list[str], list[torch.Tensor]]] = {}
        for ref, info in self._modules:
            module = ref() if info.ref() is not None else None  # None: adopted by a later model
            if module is None or info.model in self._decided:
                continue
            names, params = out.setdefault(info.model, ([], []))
            got = [p for p in module._parameters.values()
                   if p is not None and p.requires_grad and p.grad is not None]
            if got:
                names.append(info.fqn)
                params += got
        return out

    def _decide(self, model: int, baseline: _Baseline) -> None:
        self._decided.add(model)
        self._baselines.pop(model, None)
        detail = {"modules": baseline.names, "through": baseline.last_same,
                  "optimizer_steps": len(baseline.stepped_in), "lr": sorted(baseline.lrs)}
        half = sorted({str(p.dtype).removeprefix("torch.") for p in baseline.params
                       if p.dtype in (torch.float16, torch.bfloat16)})
        if half:  # updates below their precision round away (model.half(), no master copy)
            detail["dtype"] = half[0]
        self._emit(schema.Signal(baseline.step, model, "", SignalKind.WEIGHTS_UNCHANGED, detail))

    def stop(self, step: int, mode: Mode) -> None:
        self._collapsed()
        if self._optimizer_steps == 0:  # no optimizer stepped, though gradients were cleared
            for model, baseline in list(self._baselines.items()):
                if baseline.last_same > baseline.step and baseline.cleared:
                    self._decide(model, baseline)
        self._baselines.clear()


    def _decay(self, optimizer: torch.optim.Optimizer, schedule: _Schedule) -> None:
        """A ``weight-decay`` signal for the models of ``optimizer`` where a step's decay alone
        takes ``DECAY_SHRINK`` or more of every weight."""
        shrinking = type(optimizer).__name__ in _SHRINKING
        for group in optimizer.param_groups:
            lr, wd = group.get("lr"), group.get("weight_decay")
            if not (shrinking or group.get("decoupled_weight_decay")) or not (
                    isinstance(lr, (int, float)) and isinstance(wd, (int, float))):
                continue  # a tensor learning rate (capturable): not read, it may be on a device
            if lr * wd >= DECAY_SHRINK:
                schedule.decay_said = True
                for model in schedule.models:
                    self._emit(schema.Signal(
                        max(self._step - 1, 0), model, "", SignalKind.WEIGHT_DECAY, {
                        "lr": float(lr), "weight_decay": float(wd),
                        "optimizer": type(optimizer).__name__}))
                return

    def _models_of(self, optimizer: torch.optim.Optimizer) -> list[int]:
        """The models whose parameters ``optimizer`` holds (once per optimizer)."""
        owner = {id(p): info.model for ref, info in self._modules
                 if (m := ref()) is not None for p in m._parameters.values() if p is not None}
        return sorted({owner[id(p)] for group in optimizer.param_groups
                       for p in group["params"] if id(p) in owner})

    def _collapsed(self) -> None:
        """An ``lr-collapsed`` signal per optimizer that stepped half its steps or more with
        less than ``LR_FLOOR`` of its peak learning rate, for the models of its parameters."""
        for schedule in self._all_schedules:
            if schedule.low_from is None or (2 * schedule.low < schedule.steps
                                             and not schedule.factor):
                continue
            detail = {"peak": schedule.peak, "lr": schedule.last, "low_steps": schedule.low,
                      "optimizer_steps": schedule.steps}
            if schedule.factor:
                detail["factor"] = schedule.factor
            for model in schedule.models:
                self._emit(schema.Signal(schedule.low_from, model, "", SignalKind.LR_COLLAPSED,
                                         dict(detail)))


def _grad_state(p: torch.Tensor) -> tuple[weakref.ref[torch.Tensor], int]:
    grad = p.grad
    assert grad is not None  # only parameters with a gradient are fingerprinted
    return weakref.ref(grad), grad._version


#: the integer type of each element size: a float tensor's bits, summed as integers
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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
        sums.append(data.view(_BITS[data.element_size()]).sum(dtype=_BITS[data.element_size()]))
    device = sums[0].device
    return torch.stack([s.to(device) for s in sums]).tolist()

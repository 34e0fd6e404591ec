"""Whether the weights train: an observer that tells a model whose weights never change.

"My loss does not go down" often means the weights never move: ``optimizer.step()`` forgotten,
a learning rate of 0, gradients zeroed before the step (``clip_grad_norm_`` with
``max_norm=0``, ``zero_grad(set_to_none=False)`` between ``backward`` and ``step``). Each
model's trainable parameters that got a gradient are fingerprinted at the end of a recorded
step's backward (one fused float64 norm: an update of one ulp in one element changes it) and
again at the next recorded steps. The model is decided once:

* a fingerprint changed: it trains; nothing more is computed for it;
* unchanged after optimizer steps in two different steps since the first fingerprint (one
  step with a learning rate of 0 is a warmup's first): a ``weights-unchanged`` signal;
* unchanged through the run's recorded steps with no optimizer step at all, though the
  gradients were cleared between steps (a loop meant to train): the same signal, written when
  tracing stops (``detail.optimizer_steps`` 0). Weights changed by hand (no optimizer) change
  the fingerprint; gradients only added to, never cleared, are an analysis.

Cost: a fused norm of the parameters per recorded step until the model is decided (two steps
in a run that trains), one read each; nothing per module call, nothing in watched steps. Only
where the parameters are on the CPU (``stats.on_host``): on a device each read would wait for
it, and a step has one transfer, the statistics' (so a GPU run gets no such signal yet).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from hooktrace import schema
from hooktrace.naming import ModInfo
from hooktrace.records import Mode, Observer, PassEnd
from hooktrace.stats import on_host

Emit = Callable[[Any], None]


class _Baseline:
    """A model's first fingerprint, and what happened since."""

    __slots__ = ("step", "names", "params", "norms", "stepped_in", "lrs", "last_same",
                 "grad", "version", "cleared")

    def __init__(self, step: int, names: list[str], params: list[torch.Tensor],
                 norms: list[float]) -> None:
        self.step = step
        self.names = names  # the modules whose parameters are fingerprinted
        self.params = params
        self.norms = norms
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
        self._handle = register_optimizer_step_post_hook(self._stepped)

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._modules.append((weakref.ref(module), info))

    def _stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        try:
            self._optimizer_steps += 1
            lrs = {g.get("lr") for g in optimizer.param_groups}
            for baseline in self._baselines.values():
                baseline.stepped_in.add(self._step)
                baseline.lrs.update(lr for lr in lrs if isinstance(lr, (int, float)))
        except Exception:  # never into the program: the signal goes quiet instead
            self._handle.remove()

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
                self._baselines[model] = _Baseline(step, names, params, _norms(params))
                continue  # a first fingerprint, or one of other parameters
            if _norms(params) != baseline.norms:
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
            module = ref()
            if module is None or info.model in self._decided:
                continue
            names, params = out.setdefault(info.model, ([], []))
            got = [p for p in module._parameters.values()
                   if p is not None and p.requires_grad and p.grad is not None]
            if got:
                names.append(info.name)
                params += got
        return out

    def _decide(self, model: int, baseline: _Baseline) -> None:
        self._decided.add(model)
        self._baselines.pop(model, None)
        self._emit(schema.Signal(baseline.step, model, "", "weights-unchanged", {
            "modules": baseline.names, "through": baseline.last_same,
            "optimizer_steps": len(baseline.stepped_in), "lr": sorted(baseline.lrs)}))

    def stop(self, step: int, mode: Mode) -> None:
        self._handle.remove()
        if self._optimizer_steps == 0:  # no optimizer stepped, though gradients were cleared
            for model, baseline in list(self._baselines.items()):
                if baseline.last_same > baseline.step and baseline.cleared:
                    self._decide(model, baseline)
        self._baselines.clear()


def _grad_state(p: torch.Tensor) -> tuple[weakref.ref[torch.Tensor], int]:
    grad = p.grad
    assert grad is not None  # only parameters with a gradient are fingerprinted
    return weakref.ref(grad), grad._version


def _norms(params: list[torch.Tensor]) -> list[float]:
    """Each tensor's norm in float64, read at once (a NaN never equals itself: NaN weights
    count as changed; their NaN is check's other findings')."""
    norms = torch._foreach_norm([p.detach() for p in params], 2, dtype=torch.float64)
    device = norms[0].device
    return torch.stack([n.to(device) for n in norms]).tolist()

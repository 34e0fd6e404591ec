"""Updates lost to precision: float16 or bfloat16 weights whose updates round away.

A model cast to half precision (``model.to(torch.bfloat16)``, ``model.half()``) and trained
without float32 master weights keeps a weight only to 8 (bfloat16) or 11 (float16) bits: an
update below half a unit of the last place rounds back to the same weight. With a small
learning rate most updates do, and the loss stays flat while the weights' fingerprint
(``weights.py``) still changes, because a few elements move. This observer samples up to
``SAMPLE`` elements of each half-precision dense weight that got a gradient, at the end of a
recorded step's backward, and compares them after the next optimizer step: of the elements
whose gradient was not zero, the share whose value changed. A model is decided once:

* a share of ``CHANGED`` or more in a step: it trains; nothing more is computed for it;
* less than that after ``STEPS`` compared steps, over ``COMPARED`` elements or more: an
  ``updates-rounded`` signal.

Embeddings are left out (a sparse update moves only the rows it looked up). Cost: for models
with half-precision weights only, one gather of the sample per parameter at up to ``STEPS`` + 1
recorded steps; nothing per module call, nothing in watched steps; only where the parameters
are on the CPU (``stats.on_host``), as ``weights.py``.
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

SAMPLE = 64  # elements per parameter
CHANGED = 0.25  # a step that changes this share of the sampled elements trains
STEPS = 2  # compared steps before a model is said to stall
COMPARED = 100  # sampled elements with a gradient, over those steps, at least
_HALF = (torch.float16, torch.bfloat16)


class _Sample:
    """A model's sampled weights at the end of a recorded backward pass, before its update."""

    __slots__ = ("step", "params", "indices", "values", "moving", "stepped")

    def __init__(self, step: int, params: list[torch.Tensor], stepped: int) -> None:
        self.step = step
        self.params = params
        self.indices = [_indices(p.numel()) for p in params]
        flat = [p.detach().reshape(-1) for p in params]
        self.values = [f[i].clone() for f, i in zip(flat, self.indices, strict=True)]
        # the sampled elements whose gradient is not zero: those an update must move
        self.moving = [p.grad.reshape(-1)[i] != 0 for p, i in  # type: ignore[union-attr]
                       zip(params, self.indices, strict=True)]
        self.stepped = stepped  # optimizer steps so far

    def changed(self) -> tuple[int, int]:
        """(elements that moved, elements that should have) since the sample was taken."""
        moved = should = 0
        for p, i, before, moving in zip(self.params, self.indices, self.values, self.moving,
                                        strict=True):
            now = p.detach().reshape(-1)[i]
            should += int(moving.sum())
            moved += int(((now != before) & moving).sum())
        return moved, should


class HalfUpdates(Observer):
    """Writes an ``updates-rounded`` signal for a model whose half-precision weights keep their
    values though their gradients are not zero."""

    follows = ()  # no module call: first sights and passes only

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []
        self._samples: dict[int, _Sample] = {}
        self._tally: dict[int, list[int]] = {}  # per model: [steps, moved, should, first step]
        self._decided: set[int] = set()
        self._stepped = 0
        self._lrs: set[float] = set()
        self._off = False

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.has_params and "Embedding" not in type(module).__name__:
            self._modules.append((weakref.ref(module), info))

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        self._stepped += 1
        optimizer = step.optimizer
        if len(self._lrs) < 8:
            self._lrs.update(float(g["lr"]) for g in optimizer.param_groups
                             if isinstance(g.get("lr"), (int, float)))

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is not Mode.RECORDED or self._off:
            return
        try:
            self._compare(end.step)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._off = True
            self._samples.clear()

    def stop(self, step: int, mode: Mode) -> None:
        self._samples.clear()

    def _compare(self, step: int) -> None:
        for model, params in self._half_params().items():
            sample = self._samples.get(model)
            if sample is not None and self._stepped > sample.stepped and len(
                    sample.params) == len(params) and all(
                    a is b for a, b in zip(sample.params, params, strict=True)):
                moved, should = sample.changed()
                if should and moved >= CHANGED * should:
                    self._decided.add(model)  # it trains
                    self._samples.pop(model, None)
                    continue
                tally = self._tally.setdefault(model, [0, 0, 0, sample.step])
                tally[0] += 1
                tally[1] += moved
                tally[2] += should
                if tally[0] >= STEPS and tally[2] >= COMPARED:
                    self._decided.add(model)
                    self._samples.pop(model, None)
                    self._emit(schema.Signal(tally[3], model, "", SignalKind.UPDATES_ROUNDED, {
                        "through": step, "moved": tally[1], "compared": tally[2],
                        "dtype": str(params[0].dtype).removeprefix("torch."),
                        "lr": sorted(self._lrs)}))
                    continue
            self._samples[model] = _Sample(step, params, self._stepped)

    def _half_params(self) -> dict[int, list[torch.Tensor]]:
        """Per model not decided yet, its dense half-precision trainable parameters with a
        gradient now (on the CPU)."""
        out: dict[int, list[torch.Tensor]] = {}
        for ref, info in self._modules:
            module = ref() if info.ref() is not None else None  # None: adopted by a later model
            if module is None or info.model in self._decided:
                continue
            for p in module._parameters.values():
                if p is not None and p.dtype in _HALF and p.requires_grad and \
                        p.grad is not None and not p.grad.is_sparse and p.numel():
                    out.setdefault(info.model, []).append(p)
        return {model: params for model, params in out.items() if on_host(params)}


def _indices(n: int) -> torch.Tensor:
    """Up to ``SAMPLE`` positions spread evenly over a tensor of ``n`` elements."""
    k = min(n, SAMPLE)
    return torch.arange(k) * (n - 1) // max(k - 1, 1)  # distinct: n - 1 >= k - 1

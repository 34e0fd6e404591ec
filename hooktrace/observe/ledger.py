"""The parameter ledger, per trainable parameter: whether it moved over the run, and of the
ones that did not, what the optimizer steps since their first look held of them (whether an
optimizer that stepped held it, whether its ``.grad`` was there).

Each trainable parameter with a gradient is fingerprinted (``weights.bit_sums``: exact, one read)
at the end of each recorded step and of the watched steps numbered by a power of two (16, 32,
64, ...: a layer frozen for the first epochs, as DINO freezes its last layer, moves before the
run's last look); once it changed it is no longer looked at. Only where the parameters are on
the CPU, as ``weights``. When tracing stops, the parameters that never moved through two
optimizer steps or more are written, one ``params-unmoved`` signal per model. Facts only:
``check`` says why they did not train.

Cost: one integer sum per parameter not yet moved at each look (none once all moved: the
second look in a run that trains); at an optimizer step, while a parameter not yet moved has
been counted in fewer than ``_COUNTED`` steps, a ``.grad`` test of each and a membership test
in the stepping optimizer's groups; then nothing per step (a bias before a BatchNorm, whose
gradient is zero, never moves: a long run does not pay for it at every step).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.stats import on_host
from hooktrace.observe.weights import bit_sums

_SHOWN = 20  # parameters listed per model, at most
_COUNTED = 16  # optimizer steps counted per parameter: enough to say why it does not move


class _Entry:
    """One parameter not moved yet: its first look and the optimizer steps since."""

    __slots__ = ("ref", "model", "name", "bits", "step", "steps", "held", "grads")

    def __init__(self, ref: weakref.ref[Any], info: ModInfo, name: str, bits: int,
                 step: int) -> None:
        self.ref, self.model, self.bits, self.step = ref, info.model, bits, step
        self.name = f"{info.fqn}.{name}" if info.fqn else name
        self.steps = self.held = self.grads = 0  # steps; held by its optimizer; with a .grad


class ParamLedger(Observer):
    """Writes a ``params-unmoved`` signal per model with trainable parameters that never
    moved."""

    follows = ()  # no module call: first sights, passes and optimizer steps only

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._modules: list[tuple[weakref.ref[nn.Module], ModInfo]] = []
        self._unmoved: dict[int, _Entry] = {}  # id(parameter) -> its entry
        self._moved: set[int] = set()
        self._counting = False  # some entry is counted in fewer than _COUNTED steps
        self._off = False

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._modules.append((weakref.ref(module), info))

    def backward_end(self, end: PassEnd) -> None:
        watched_look = end.step >= 16 and end.step & (end.step - 1) == 0
        if self._off or not (end.mode is Mode.RECORDED or watched_look):
            return
        try:
            self._look(end.step)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._off = True
            self._unmoved.clear()

    def _look(self, step: int) -> None:
        found: list[tuple[int, Any, ModInfo, str]] = []
        for ref, info in self._modules:
            module = ref()
            if module is None:
                continue
            for name, p in module._parameters.items():
                if (p is not None and p.requires_grad and p.grad is not None
                        and id(p) not in self._moved):
                    found.append((id(p), p, info, name))
        if not found or not on_host([p for _, p, _, _ in found]):
            return  # on a device a read would wait for it: not looked at there
        for (key, p, info, name), bits in zip(found, bit_sums([f[1] for f in found]),
                                              strict=True):
            entry = self._unmoved.get(key)
            if entry is None or entry.ref() is not p:  # a first look (or a reused id)
                self._unmoved[key] = _Entry(weakref.ref(p), info, name, bits, step)
                self._counting = True
            elif bits != entry.bits:
                self._moved.add(key)
                del self._unmoved[key]

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
        if not self._counting:
            return
        for entry in self._unmoved.values():
            entry.steps = min(entry.steps + 1, _COUNTED)
        self._counting = any(e.steps < _COUNTED for e in self._unmoved.values())

    def stop(self, step: int, mode: Mode) -> None:
        by_model: dict[int, list[_Entry]] = {}
        for entry in self._unmoved.values():
            if entry.steps >= 2:  # named when first looked at: its model may be gone now
                by_model.setdefault(entry.model, []).append(entry)
        for model, entries in sorted(by_model.items()):
            params = [{"param": e.name, "since": e.step, "steps": e.steps, "held": e.held,
                       "grads": e.grads} for e in sorted(entries, key=lambda e: e.name)]
            self._emit(schema.Signal(min(e.step for e in entries), model, "",
                                     SignalKind.PARAMS_UNMOVED,
                                     {"params": params[:_SHOWN], "count": len(params)}))
        self._unmoved.clear()

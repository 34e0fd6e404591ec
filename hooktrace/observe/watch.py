"""Watched steps: after the fully recorded steps, keep looking, write only what is wrong.

A 10,000-step run must not write gigabytes, yet a NaN that first appears at step 9,000 must still
be found with its module. A watched step is cheap: the core follows each call's forward but only
the model calls' backward (no hook per call's tensors). This observer checks each forward output
for NaN/Inf (``outputs.HeldOutputs``: one check per model call, the held outputs checked one by
one only when the model's are not finite) and, when the step ends, the gradient that reached
each model call and the parameter gradients of the modules called with gradients on (one fused
norm per device and dtype), and emits ``anomaly`` records: the first module whose output held
NaN/Inf; the first NaN/Inf
gradient (at a model's output, else the first module in backward order whose parameter
gradient is NaN/Inf); modules with trainable parameters that got a gradient before and no
longer do while the rest of their model does.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import BackwardStart, ForwardCall, ForwardEnd, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.observe.nanweights import nonfinite_params
from hooktrace.observe.outputs import Found, HeldOutputs
from hooktrace.observe.stats import Stats

_MAX_HELD = 8192  # model calls and modules held per step: forward-only code is bounded
WATCHED = Mode.WATCHED

_Numbers = list[tuple[float, ...] | None]
# a module's parameter gradients as a step left them: each tensor, and its version then
_GradState = tuple[list[weakref.ref[torch.Tensor]], list[int]]


class Watch(Observer):
    follows = (WATCHED,)

    def __init__(self, stats: Stats, emit: Callable[[Any], None]) -> None:
        self._stats = stats
        self._outputs = HeldOutputs(stats, stats.hold_bytes)
        self._emit = emit
        # the gradient reaching each model call of the step
        self._model_grads: dict[BackwardStart, _Numbers] = {}
        # modules with parameters called with gradients on in this step: their first call
        self._called: dict[ModInfo, ForwardCall] = {}
        self._states: dict[ModInfo, _GradState] = {}  # as the last step that judged them left
        self._had_grad: set[ModInfo] = set()  # modules that received gradient at some step

    def forward_end(self, end: ForwardEnd) -> None:
        call = end.call
        self._outputs.add(end.outputs, call, end.top)
        if end.top and self._outputs.waiting > _MAX_HELD and not end.in_backward:
            self._stats.resolve()
            for anomaly in self._forward_anomalies(call.step):
                self._emit(anomaly)
        if end.start.grad and call.info.has_params and len(self._called) < _MAX_HELD:
            self._called.setdefault(call.info, call)

    def backward_start(self, start: BackwardStart) -> None:
        if start.mode is WATCHED:
            self._model_grads[start] = [None] * start.call.n_out

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        numbers = self._model_grads.get(start)
        if numbers is not None:
            self._stats.grad(grad, numbers, index, False)

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is WATCHED:
            changed = self._changed_params()
            norms: list[float | None] = [None] * sum(len(grads) for _, _, grads in changed)
            self._stats.norms([g for _, _, grads in changed for g in grads], norms)
            self._stats.end_pass()
            self._stats.resolve()
            for anomaly in self._end_step(end.step, changed, norms):
                self._emit(anomaly)

    def stop(self, step: int, mode: Mode) -> None:
        if mode is WATCHED:
            self._stats.resolve()  # a NaN seen in a step that never reached its backward
            for anomaly in self._forward_anomalies(step):
                self._emit(anomaly)
            self._outputs.reset()

    def _changed_params(self) -> list[tuple[ModInfo, ForwardCall, list[torch.Tensor]]]:
        """The step's modules whose parameter gradients changed since a step last judged them
        (a new tensor, or one added to): a backward reached them."""
        changed = []
        states = self._states
        for info, call in self._called.items():
            module = info.ref()
            if module is None:
                continue
            grads = [g for p in module._parameters.values()
                     if p is not None and (g := p.grad) is not None and p.requires_grad]
            if not grads:
                continue
            before = states.get(info)
            if before is not None and _unchanged(before, grads):
                continue
            states[info] = ([weakref.ref(g) for g in grads], [g._version for g in grads])
            changed.append((info, call, grads))
        return changed

    def _forward_anomalies(self, step: int) -> list[schema.Anomaly]:
        bad: list[tuple[ForwardCall, Found]] = self._outputs.take()
        if not bad:
            return []
        call, found = bad[0]
        info = call.info
        detail: dict[str, Any] = {
            "outputs": [{"index": i, "nan": nan, "inf": inf} for i, nan, inf in found],
            "modules_with_nonfinite_outputs": len(bad)}
        weights = nonfinite_params(info.ref())  # as they are now: no optimizer step since
        if weights:
            detail["weights"] = list(weights)
            detail["weights_dtypes"] = sorted(set(weights.values()))
        return [schema.Anomaly(step, info.model, info.name, "nonfinite-forward", call.call_index,
                               detail)]

    def _end_step(self, step: int, changed: list[tuple[ModInfo, ForwardCall, list[torch.Tensor]]],
                  norms: list[float | None]) -> list[schema.Anomaly]:
        """Anomalies of ``step``; call after the step's statistics are resolved."""
        out = self._forward_anomalies(step)
        nonfinite = self._nonfinite_backward(step, changed, norms)
        if nonfinite is not None:
            out.append(nonfinite)
        out += self._lost_gradients(step, changed)
        self._model_grads.clear()
        self._called.clear()
        return out

    def _nonfinite_backward(self, step: int,
                            changed: list[tuple[ModInfo, ForwardCall, list[torch.Tensor]]],
                            norms: list[float | None]) -> schema.Anomaly | None:
        """A NaN/Inf gradient reaching a model call, else the first module in backward order (the
        last called first) whose parameter gradient is NaN/Inf."""
        for start, numbers in self._model_grads.items():
            if any(s is not None and not math.isfinite(s[0]) for s in numbers):
                info = start.call.info
                return schema.Anomaly(step, info.model, info.name, "nonfinite-backward",
                                      start.call.call_index, {"produced": False})
        if all(n is None or math.isfinite(n) for n in norms):
            return None
        end = len(norms)
        for info, call, grads in reversed(changed):
            mine = [n for n in norms[end - len(grads):end] if n is not None]
            end -= len(grads)
            if not all(map(math.isfinite, mine)):
                norm = math.sqrt(sum(n * n for n in mine))
                return schema.Anomaly(step, info.model, info.name, "nonfinite-backward",
                                      call.call_index,
                                      {"produced": True, "parameter_grad_norm": str(norm)})
        return None

    def _lost_gradients(self, step: int,
                        changed: list[tuple[ModInfo, ForwardCall, list[torch.Tensor]]]
                        ) -> list[schema.Anomaly]:
        """Modules called with gradients on that got a gradient before and none in this step,
        while other modules of their model did (a model trained in turns, as a GAN's
        generator is, starves as a whole in the other model's steps: not a lost gradient)."""
        got = {info for info, _, _ in changed}
        trained = {info.model for info in got}
        out: list[schema.Anomaly] = []
        for info, call in self._called.items():
            if info in got:
                self._had_grad.add(info)
            elif info in self._had_grad and info.model in trained:
                self._had_grad.discard(info)  # reported once, until it receives gradient again
                out.append(schema.Anomaly(step, info.model, info.name, "no-grad",
                                          call.call_index, {"had_gradient_before": True}))
        return out


def _unchanged(before: _GradState, grads: list[torch.Tensor]) -> bool:
    """The same gradient tensors as ``before``, none added to since."""
    refs, versions = before
    if len(refs) != len(grads) or refs[0]() is not grads[0]:
        return False  # the common case, gradients set to None and made again: one look
    for ref, version, g in zip(refs, versions, grads, strict=True):
        if ref() is not g or version != g._version:
            return False
    return True

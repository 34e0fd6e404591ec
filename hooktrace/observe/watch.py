"""Watched steps: after the fully recorded steps, keep looking, write only what is wrong.

A 10,000-step run must not write gigabytes, yet a NaN that first appears at step 9,000 must still
be found with its module. A watched step is cheap: the core follows each call's forward but only
the model calls' backward (no hook per call's tensors). This observer checks each forward output
for NaN/Inf (``outputs.HeldOutputs``: one check per model call) and, when the step ends, the
gradient that reached each model call and the parameter gradients of the modules called with
gradients on (one fused norm per device and dtype), and emits ``anomaly`` records: the first
module whose output held NaN/Inf; the first NaN/Inf gradient (at a model's output, else the
first module in backward order whose parameter gradient is NaN/Inf); modules with trainable
parameters that got a gradient before and no longer do while the rest of their model does, for
longer than they ever went without one (learnt from the recorded steps too: heads trained by
losses in turns are periodic).

A step whose model ran compiled code (``torch.compile``: no module hook fires inside it) ends at
``backward()``'s return (``core.CallTracker.backward_returned``) with no call seen: its
parameter gradients are judged as those of the modules earlier steps saw called, and when one
is NaN/Inf the next step runs eagerly (``look``: ``eager.EagerSteps``), so that the first module
whose output is NaN/Inf is named; the anomaly is said at the compiled step, with the step that
named it (``detail.named_in``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter, ne
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import (
    BackwardStart,
    Emit,
    ForwardCall,
    ForwardEnd,
    Mode,
    Observer,
    PassEnd,
)
from hooktrace.log import schema
from hooktrace.log.schema import AnomalyKind
from hooktrace.observe.nanweights import nonfinite_params
from hooktrace.observe.outputs import HeldOutputs, NonFinite
from hooktrace.observe.stats import TensorStats

_MAX_HELD = 8192  # model calls and modules held per step: forward-only code is bounded
WATCHED = Mode.WATCHED
_NONFINITE = (AnomalyKind.NONFINITE_FORWARD, AnomalyKind.NONFINITE_BACKWARD)
_SPELL = 10  # watched steps in a row that write the same NaN/Inf

_Numbers = list[tuple[float, ...] | None]
# a module's parameter gradients as a step left them: each tensor, and its version then
_GradState = tuple[list[weakref.ref[torch.Tensor]], list[int]]
# the step's modules whose parameter gradients changed, with their first call and gradients
_Changed = list[tuple[ModInfo, ForwardCall, list[torch.Tensor]]]


class Watch(Observer):
    follows = (WATCHED,)

    def __init__(self, stats: TensorStats, emit: Emit,
                 look: Callable[[], None] = lambda: None) -> None:
        self._stats = stats
        self._look = look  # the next step runs eagerly
        self._outputs = HeldOutputs(stats, stats.hold_bytes)
        self._emit = emit
        # the gradient reaching each model call of the step
        self._model_grads: dict[BackwardStart, _Numbers] = {}
        # modules with parameters called with gradients on in this step: their first call
        self._called: dict[ModInfo, ForwardCall] = {}
        self._states: dict[ModInfo, _GradState] = {}  # as the last step that judged them left
        self._gaps = Gaps()  # the steps each module went without gradient
        # modules with parameters called with gradients on in any step: judged in a compiled one
        self._known: dict[ModInfo, ForwardCall] = {}
        self._held: list[schema.Anomaly] = []  # of a compiled step, until an eager one names it
        self._looked: set[ModInfo] = set()  # modules a compiled step found without gradient
        self._nonfinite_held = False
        # NaN/Inf of a model and kind at the last watched step: in how many steps in a row
        self._spells: dict[tuple[str, int], int] = {}

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
        for info in end.called:  # of any step: what a compiled step's gradients are judged by
            if info.has_params and info not in self._known and len(self._known) < _MAX_HELD:
                self._known[info] = ForwardCall(-1, end.step, info, 0, False, 0, 0)
        if end.mode is not WATCHED:
            if end.mode is Mode.RECORDED:
                self._gaps.learn(end.reached, end.step)
            return
        compiled = not end.called and bool(self._known)
        if compiled:
            self._called = dict(self._known)
        changed = self._changed_params()
        norms: list[float | None] = [None] * sum(len(grads) for _, _, grads in changed)
        self._stats.norms([g for _, _, grads in changed for g in grads], norms)
        self._stats.end_pass()
        self._stats.resolve()
        nonfinite = self._nonfinite_backward(end.step, changed, norms)
        if compiled:
            self._judge_compiled(end.step, changed, nonfinite)
        else:
            anomalies = self._forward_anomalies(end.step)
            if nonfinite is not None:
                anomalies.append(nonfinite)
            anomalies += self._gaps.lost(end.step, changed, self._called)
            if self._held:
                anomalies = self._named(anomalies)
            for anomaly in self._new_spells(anomalies):
                self._emit(anomaly)
        self._model_grads.clear()
        self._called.clear()

    def _new_spells(self, anomalies: list[schema.Anomaly]) -> list[schema.Anomaly]:
        """``anomalies`` less the NaN/Inf of a model and kind that the last ``_SPELL`` watched
        steps in a row said already: a run that stays NaN from step 10 of 100,000 on writes
        ``2 * _SPELL`` records, not two per step (``check`` says the steps it saw again). A
        step without it ends the spell (a ``GradScaler`` skipping a step with Inf gradients:
        each one is said)."""
        spells = {(a.kind, a.model): self._spells.get((a.kind, a.model), 0) + 1
                  for a in anomalies if a.kind in _NONFINITE}
        self._spells = spells
        return [a for a in anomalies
                if a.kind not in _NONFINITE or spells[(a.kind, a.model)] <= _SPELL]

    def _judge_compiled(self, step: int, changed: _Changed,
                        nonfinite: schema.Anomaly | None) -> None:
        """A step compiled code ran: a NaN/Inf gradient is held until the next step, run
        eagerly, names its module; a module that got no gradient while the rest of its model
        did makes the next step eager too (once per module: which modules a compiled step
        called is not known, and the eager step judges it as any watched step)."""
        got = {info for info, _, _ in changed}
        trained = {info.model for info in got}
        lost = [info for info in self._called if info not in got and info in self._gaps.had_grad
                and info.model in trained and info not in self._looked]
        for info in got:
            self._gaps.got(info, step)
        if self._nonfinite_held:
            nonfinite = None  # the first one only
        if nonfinite is not None:
            self._nonfinite_held = True
            nonfinite.detail["compiled"] = True
            weights = self._nonfinite_weights(step, [info for info, _, _ in changed])
            if weights is not None:  # the step ran with NaN/Inf weights: their module is it
                self._emit(weights)
                nonfinite = None
            else:
                self._held = [nonfinite]
        if nonfinite is not None or lost:
            self._looked.update(lost)
            self._look()

    def _nonfinite_weights(self, step: int, infos: list[ModInfo]) -> schema.Anomaly | None:
        """The first of ``infos`` (in the order they were first called) whose own parameters
        hold NaN/Inf, as the anomaly of a forward that ran with them (a rare path: once)."""
        for info in infos:
            weights = _weights(info)
            if weights:
                return schema.Anomaly(step, info.model, info.fqn, AnomalyKind.NONFINITE_FORWARD,
                                      0, {**weights, "compiled": True})
        return None

    def _named(self, anomalies: list[schema.Anomaly]) -> list[schema.Anomaly]:
        """The held anomaly of a compiled step, named by this eager step's first NaN/Inf
        output where it found one (not where that module's weights were NaN/Inf already: the
        optimizer step after the compiled one made them so, any module may show it first);
        this step's own anomalies of the same kind are the same."""
        held, self._held = self._held, []
        forward = [a for a in anomalies if a.kind == AnomalyKind.NONFINITE_FORWARD
                   and "weights" not in a.detail]
        if forward:
            named = forward[0]
            named.detail["named_in"] = named.step
            named.step = held[0].step
            held = [named]
        return held + [a for a in anomalies if a.kind == AnomalyKind.NO_GRAD]

    def stop(self, step: int, mode: Mode) -> None:
        if mode is WATCHED:
            self._stats.resolve()  # a NaN seen in a step that never reached its backward
            for anomaly in self._new_spells(self._forward_anomalies(step)):
                self._emit(anomaly)
            self._outputs.reset()
        for anomaly in self._held:  # no eager step came after it
            self._emit(anomaly)
        self._held = []

    def _changed_params(self) -> _Changed:
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
        bad: list[tuple[ForwardCall, NonFinite]] = self._outputs.take()
        if not bad:
            return []
        call, found = bad[0]
        info = call.info
        detail: dict[str, Any] = {
            "outputs": [{"index": i, "nan": nan, "inf": inf} for i, nan, inf in found],
            "modules_with_nonfinite_outputs": len(bad)}
        detail.update(_weights(info))  # as they are now: no optimizer step since
        return [schema.Anomaly(step, info.model, info.fqn, AnomalyKind.NONFINITE_FORWARD,
                               call.call_index, detail)]

    def _nonfinite_backward(self, step: int, changed: _Changed,
                            norms: list[float | None]) -> schema.Anomaly | None:
        """A NaN/Inf gradient reaching a model call, else the first module in backward order (the
        last called first) whose parameter gradient is NaN/Inf."""
        for start, numbers in self._model_grads.items():
            if any(s is not None and not math.isfinite(s[0]) for s in numbers):
                info = start.call.info
                return schema.Anomaly(step, info.model, info.fqn, AnomalyKind.NONFINITE_BACKWARD,
                                      start.call.call_index, {"produced": False})
        if all(n is None or math.isfinite(n) for n in norms):
            return None
        end = len(norms)
        for info, call, grads in reversed(changed):
            mine = [n for n in norms[end - len(grads):end] if n is not None]
            end -= len(grads)
            if not all(map(math.isfinite, mine)):
                norm = math.sqrt(sum(n * n for n in mine))
                return schema.Anomaly(step, info.model, info.fqn, AnomalyKind.NONFINITE_BACKWARD,
                                      call.call_index,
                                      {"produced": True, "parameter_grad_norm": str(norm)})
        return None


class Gaps:
    """Which modules receive gradient, and the most steps each went without it: a module that
    goes longer than that while the rest of its model trains has lost its gradient."""

    def __init__(self) -> None:
        self.had_grad: set[ModInfo] = set()  # modules that received gradient at some step
        # the last step each module received gradient in, and the most steps between two (1
        # where not kept; recorded steps too): a module trained in turns misses it that long
        # less one; one whose next gradient would come later than that has lost it
        self._got_at: dict[ModInfo, int] = {}
        self._gap: dict[ModInfo, int] = {}

    def got(self, info: ModInfo, step: int) -> None:
        self._widen(info, self._got_at.get(info), step)
        self._got_at[info] = step
        self.had_grad.add(info)

    def _widen(self, info: ModInfo, last: int | None, step: int) -> None:
        if last is not None and step - last > self._gap.get(info, 1):
            self._gap[info] = step - last

    def learn(self, reached: tuple[ModInfo, ...], step: int) -> None:
        """A recorded pass's modules with parameters whose backward began: ``got`` for each,
        in C but for those whose last gradient was not in the pass before (a gap of one pass,
        the usual, is ``_gap``'s default)."""
        infos = list(compress(reached, map(_has_params, reached)))
        before = list(map(self._got_at.get, infos))
        self._got_at.update(zip(infos, repeat(step)))
        self.had_grad.update(infos)
        irregular = map(ne, before, repeat(step - 1))
        for info, last in compress(zip(infos, before, strict=True), irregular):
            self._widen(info, last, step)

    def lost(self, step: int, changed: _Changed,
             called: dict[ModInfo, ForwardCall]) -> list[schema.Anomaly]:
        """Modules called with gradients on that got a gradient before and none in this step,
        while other modules of their model did (a model trained in turns, as a GAN's
        generator is, starves as a whole in the other model's steps: not a lost gradient),
        for longer than the most steps they went without one before (heads trained by losses
        in turns, a generator's step after five of its critic's: periodic, not lost), and
        that still have trainable parameters (not frozen on purpose)."""
        got = {info for info, _, _ in changed}
        trained = {info.model for info in got}
        out: list[schema.Anomaly] = []
        for info, call in called.items():
            if info in got:
                self.got(info, step)
            elif (info in self.had_grad and info.model in trained
                  and step - self._got_at[info] >= self._gap.get(info, 1)
                  and _trainable(info)):
                self.had_grad.discard(info)  # reported once, until it receives gradient again
                out.append(schema.Anomaly(step, info.model, info.fqn, AnomalyKind.NO_GRAD,
                                          call.call_index, {"had_gradient_before": True,
                                                            "last": self._got_at[info],
                                                            "gap": self._gap.get(info, 1)}))
        return out


_has_params = attrgetter("has_params")


def _weights(info: ModInfo) -> dict[str, list[str]]:
    """The module's own parameters that hold NaN/Inf, and their dtypes, as an anomaly says."""
    weights = nonfinite_params(info.ref())
    if not weights:
        return {}
    return {"weights": list(weights), "weights_dtypes": sorted(set(weights.values()))}


def _trainable(info: ModInfo) -> bool:
    module = info.ref()
    return module is not None and any(p is not None and p.requires_grad
                                      for p in module._parameters.values())


def _unchanged(before: _GradState, grads: list[torch.Tensor]) -> bool:
    """The same gradient tensors as ``before``, none added to since."""
    refs, versions = before
    if len(refs) != len(grads) or refs[0]() is not grads[0]:
        return False  # the common case, gradients set to None and made again: one look
    for ref, version, g in zip(refs, versions, grads, strict=True):
        if ref() is not g or version != g._version:
            return False
    return True

"""The step, explained: what the sampled parameters' gradients and weights did around each
optimizer step, against the gradients of the passes before it (issue 36). The end of each
backward pass and PyTorch's global optimizer step hooks look at a few things; one
``step-sample`` signal of facts per model of the sample is written when tracing stops (its
fields: ``log/signals.py``), and ``check/stepexplained.py`` decides what they mean:

* ``cleared``: ``zero_grad()`` per micro-batch applies the last micro-batch's gradient only;
  PCGrad's per-task passes set a combined ``.grad`` before the step (not counted), and under an
  enabled GradScaler a step it skips looks the same (not counted);
* ``flips``: ``clip_grad_norm_`` with a negative ``max_norm`` negates every gradient;
* ``moves`` (``stepmove.py``): the same sample's weights read just before and after the step.

Cost: at each backward pass's end, ``PARAMS`` identity and version reads; in recorded steps on
the CPU (``stats.on_host``: a read on a device would wait for it), two gathers of ``SAMPLE``
elements per sampled parameter. Nothing per module call.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.ledger import spread
from hooktrace.observe.lossscale import find_scaler
from hooktrace.observe.optimizers import Optimizers
from hooktrace.observe.optsteps import modules_of
from hooktrace.observe.stats import on_host
from hooktrace.observe.stepmove import Moves, Sampled

PARAMS = 4  # parameters sampled
SAMPLE = 16  # elements of each one's gradient
LISTED = 20  # steps listed in a signal


class StepSample(Observer):
    """Writes a ``step-sample`` signal per model of the sampled parameters."""

    follows = ()  # no module call: passes and optimizer steps only

    def __init__(self, emit: Emit, optimizers: Optimizers) -> None:
        self._emit = emit
        self._modules = optimizers.modules  # every module with parameters
        self._step = 0  # the last backward pass
        self._stepped = 0  # optimizer steps so far
        self._off = False
        # the sampled parameters, their .grad and version at the last pass's end, the optimizer
        # steps then; their sampled gradient values where that pass was recorded (on the CPU)
        self._sample: list[weakref.ref[torch.Tensor]] = []
        self._sample_names: dict[int, list[str]] = {}  # per model, the sample's modules
        self._grads: list[weakref.ref[torch.Tensor] | None] = []
        self._versions: list[int] = []
        self._gradversions: list[int] = []
        self._stepped_then = -1
        self._values: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self._moving: Sampled = []  # the same sample's parameters and indices, for the moves
        self._names = partial(modules_of, optimizers.owner)
        self._moves = Moves(self._names)
        self._scaler: Callable[[], Any] | None = None  # the GradScaler, once looked for
        self._cleared: list[int] = []  # passes of this accumulation whose gradients were dropped
        # passes dropped before one step -> [accumulations so, the first one's first pass]
        self._drops: dict[int, list[int]] = {}
        # steps whose gradient was negated (the first LISTED, each with its factor), how many
        self._flipped: list[tuple[int, float]] = []
        self._flipped_count = 0

    # -- passes ------------------------------------------------------------------------------
    def backward_end(self, end: PassEnd) -> None:
        self._step = end.step
        if self._off:
            return
        try:
            self._pass(end)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._stop_looking()

    def _pass(self, end: PassEnd) -> None:
        params = [p for p in (ref() for ref in self._sample) if p is not None]
        if len(params) < len(self._sample) or not params:
            params = self._pick()
            self._grads = []
        if self._stepped == self._stepped_then and self._grads:
            dropped = kept = 0
            for p, ref, version in zip(params, self._grads, self._versions, strict=False):
                if ref is None or p.grad is None:
                    continue
                if p.grad is not ref() and p._version == version:
                    dropped += 1
                else:
                    kept += 1
            if dropped and not kept and not self._scaled():
                self._cleared.append(end.step)
        self._grads = [None if p.grad is None else weakref.ref(p.grad) for p in params]
        self._versions = [p._version for p in params]
        self._gradversions = [-1 if p.grad is None else p.grad._version for p in params]
        self._stepped_then = self._stepped
        self._values = None
        self._moving = []
        if end.mode is Mode.RECORDED and params and on_host(params):
            self._values = [(p, i, g.reshape(-1)[i].clone()) for p in params
                            if (g := p.grad) is not None and g.layout is torch.strided
                            and (i := spread(g.numel(), SAMPLE)).numel()]
            self._moving = [(weakref.ref(p), i) for p, i, _ in self._values]

    def _scaled(self) -> bool:
        """Whether the code running backward holds an enabled GradScaler, looked for at the
        first drop: its ``step`` skips the optimizer's where gradients are not finite, and the
        ``zero_grad`` of the next iteration then looks like one inside an accumulation."""
        if self._scaler is None:
            main = sys._current_frames().get(threading.main_thread().ident or -1)
            found = find_scaler(sys._getframe()) or find_scaler(main)
            self._scaler = (lambda: None) if found is None else weakref.ref(found)
        scaler = self._scaler()
        return scaler is not None and bool(scaler.is_enabled())

    def _pick(self) -> list[torch.Tensor]:
        """Up to ``PARAMS`` trainable parameters with a gradient now, the first modules'."""
        picked: list[torch.Tensor] = []
        for ref, info in self._modules:
            module = ref() if info.ref() is not None else None
            for p in module._parameters.values() if module is not None else ():
                if p is not None and p.requires_grad and p.grad is not None:
                    picked.append(p)
            if len(picked) >= PARAMS:
                break
        picked = picked[:PARAMS]
        self._sample = [weakref.ref(p) for p in picked]
        self._sample_names = self._names(picked)
        return picked

    # -- optimizer steps ---------------------------------------------------------------------
    def optimizer_stepping(self, step: OptimizerStep) -> None:
        optimizer, args, kwargs = step
        if self._off:
            return
        if any(a is not None for a in args[1:]) or kwargs.get("closure") is not None:
            return  # a closure recomputes the gradients (LBFGS): not judged
        try:
            if self._cleared and not self._applies_last_pass():
                self._cleared = []  # gradients combined by hand (PCGrad): not one pass's
            self._moves.before(optimizer, self._moving, kwargs)
            if self._values is not None and self._stepped == self._stepped_then:
                self._look_sign(optimizer)
        except Exception:
            self._stop_looking()

    def _applies_last_pass(self) -> bool:
        """Whether the sampled parameters' ``.grad`` is still the tensor the last pass left,
        unchanged since: the step applies that pass's gradient alone."""
        return any(ref is not None and p.grad is not None and p.grad is ref()
                   and p.grad._version == version for p, ref, version in
                   zip(self._live_sample(), self._grads, self._gradversions, strict=False))

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if self._off:
            return
        optimizer = step.optimizer
        self._stepped += 1
        try:
            self._moves.after(optimizer, self._step)
        except Exception:
            self._stop_looking()
        if self._cleared:
            self._drops.setdefault(len(self._cleared), [0, self._cleared[0]])[0] += 1
        self._cleared = []

    def _look_sign(self, optimizer: torch.optim.Optimizer) -> None:
        """The sampled gradients now against the same elements at the last pass's end: each
        the other times one negative factor."""
        values, self._values = self._values, None
        assert values is not None
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        factors: list[float] = []
        for p, i, before in values:
            if id(p) not in held or p.grad is None:
                continue
            now = p.grad.reshape(-1)[i].to(before.dtype)
            norm = float(before.double().square().sum())
            if not norm:
                continue
            factor = float((now.double() * before.double()).sum()) / norm
            off = float((now.double() - factor * before.double()).square().sum())
            if off > 1e-6 * norm * max(factor * factor, 1e-12):
                return  # not one factor: the gradient changed otherwise (not judged)
            factors.append(factor)
        if factors and all(f < 0 for f in factors):
            self._flipped_count += 1
            if len(self._flipped) < LISTED:
                self._flipped.append((self._step, max(factors)))

    def _live_sample(self) -> list[torch.Tensor]:
        return [p for p in (ref() for ref in self._sample) if p is not None]

    def _stop_looking(self) -> None:
        self._off = True
        self._values = None
        self._moving = []

    # -- the end -----------------------------------------------------------------------------
    def stop(self, step: int, mode: Mode) -> None:
        names = self._sample_names  # named when picked: the models may be gone by now
        for model in sorted(set(names) | {m for n in self._moves.modules.values() for m in n}):
            detail: dict[str, Any] = {"modules": names.get(model, [])}
            if self._drops and model in names:
                detail["cleared"] = [[drops, *self._drops[drops]] for drops in sorted(self._drops)]
            if self._flipped and model in names:
                detail["flips"] = {"steps": [s for s, _ in self._flipped],
                                   "count": self._flipped_count, "factor": self._flipped[0][1]}
            if moves := self._moves.facts(model):
                detail["moves"] = moves
            if len(detail) > 1:
                first = min([s for s, _ in self._flipped] + [d[2] for d in detail.get(
                    "cleared", [])] + [m["steps"][0][0] for m in moves] or [0])
                self._emit(schema.Signal(first, model, (detail["modules"] or [""])[0],
                                         SignalKind.STEP_SAMPLE, detail))
        self._values = None
        self._moving = []

"""Loss scaling, for the loss observer (``loss.py``): the ``GradScaler`` of the code that runs
backward, its scale in each recorded step (``loss-scale`` when it changes: until
``scaler.unscale_``, a pass's gradients are the true ones times that scale, which ``check``
divides out), and the gradients a scaled recorded pass left, still unchanged when an optimizer
steps or ``clip_grad_norm_`` runs while the scaler has unscaled no optimizer since its last
update (``scaled-step``, ``scaled-clip``, each said once).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable
from types import FrameType
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.owners import is_library
from hooktrace.hooks.records import Emit, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

_LOOKS = 16  # recorded passes in which to look for a scaler before giving up
_SCALERS = ("GradScaler", "ShardedGradScaler")  # torch.amp's, torch.cuda.amp's, FSDP's


def find_scaler(frame: FrameType | None) -> Any:
    """The first scaler held by the user's code on ``frame``'s stack (not the libraries'):
    among a frame's variables, or the attributes of its ``self``."""
    while frame is not None:
        if not is_library(frame.f_code.co_filename):
            held = frame.f_locals
            for value in (*held.values(), *getattr(held.get("self"), "__dict__", {}).values()):
                if type(value).__name__ in _SCALERS and hasattr(value, "_scale"):
                    return value
        frame = frame.f_back
    return None


def _unscaled(scaler: Any) -> bool:
    """The scaler unscaled an optimizer since its last update."""
    return any(state["stage"] is not OptState.READY
               for state in scaler._per_optimizer_states.values())


class Scaling:
    """The scaler, and the .grad of the parameters a scaled recorded pass reached, as it left
    them: id(parameter) -> the .grad, its version then, the parameter's module, the step."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._scaler: weakref.ref[Any] | None = None
        self._looks = 0
        self._last: dict[int, float] = {}  # per model, the scale last written
        self.scaled: dict[int, tuple[weakref.ref[torch.Tensor], int, ModInfo, int]] = {}
        self._said_steps: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.said_clip = False

    def known(self) -> Any:
        return self._scaler() if self._scaler is not None else None

    def find(self, frame: FrameType | None) -> Any:
        """The scaler, looked for on ``frame``'s stack and the main thread's (the pass may end
        in an engine thread) in the first ``_LOOKS`` recorded passes."""
        scaler = self.known()
        if scaler is not None or self._looks >= _LOOKS:
            return scaler
        self._looks += 1
        main = sys._current_frames().get(threading.main_thread().ident or -1)
        scaler = find_scaler(frame) or find_scaler(main)
        if scaler is not None:
            self._scaler = weakref.ref(scaler)
        return scaler

    def say_scale(self, end: PassEnd, scaler: Any) -> None:
        """``loss-scale`` of the models a recorded pass reached, where it changed."""
        if scaler is None or not scaler.is_enabled() or scaler._scale is None:
            return
        scale = float(scaler._scale)  # one read a recorded step (on a GPU, it waits for it)
        for model in sorted({info.model for info in end.reached}):
            if self._last.get(model) != scale:
                self._last[model] = scale
                self._emit(schema.Signal(end.step, model, "", SignalKind.LOSS_SCALE,
                                         {"scale": scale}))

    def remember(self, end: PassEnd) -> None:
        """The .grad of the parameters of the modules a scaled pass reached, as it left them."""
        for info in end.reached:
            module = info.ref() if info.has_params else None
            if module is None:
                continue
            for p in module._parameters.values():
                grad = p.grad if p is not None else None
                if grad is not None:
                    self.scaled[id(p)] = (weakref.ref(grad), grad._version, info, end.step)

    def _still_scaled(self, params: Iterable[Any], keep: bool) -> dict[int, list[ModInfo]]:
        """Of ``params``, those whose .grad is as a scaled pass left it, by step (and their
        entries dropped unless ``keep``)."""
        found: dict[int, list[ModInfo]] = {}
        for p in params:
            entry = self.scaled.get(id(p)) if keep else self.scaled.pop(id(p), None)
            grad: Any = getattr(p, "grad", None)
            if entry is not None and grad is not None and grad._version == entry[1] \
                    and entry[0]() is grad:
                found.setdefault(entry[3], []).append(entry[2])
        return found

    def _say(self, kind: str, found: dict[int, list[ModInfo]], detail: dict[str, Any]) -> None:
        step = min(found)
        infos = [info for infos in found.values() for info in infos]
        for model in sorted({info.model for info in infos}):
            names = list(dict.fromkeys(i.fqn for i in infos if i.model == model))
            self._emit(schema.Signal(step, model, "", kind, {**detail, "modules": names}))

    def stepping(self, optimizer: Any) -> None:
        """An optimizer steps: the gradients it holds still as a scaled pass left them."""
        scaler = self.known()
        # scaler.step unscales first (an optimizer it wraps, ZeroRedundancyOptimizer's, steps
        # inside it: any optimizer unscaled since the scaler's update counts); an optimizer
        # that unscales itself (fused Adam) is handed optimizer.grad_scale
        unscaled = scaler is None or _unscaled(scaler) or \
            getattr(optimizer, "grad_scale", None) is not None
        params = [p for group in optimizer.param_groups for p in group["params"]]
        found = self._still_scaled(params, keep=False)
        if found and not unscaled and optimizer not in self._said_steps:
            self._said_steps.add(optimizer)
            self._say(SignalKind.SCALED_STEP, found, {"optimizer": type(optimizer).__name__})

    def clipping(self, parameters: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``clip_grad_norm_`` runs on gradients still as a scaled pass left them."""
        scaler = self.known()
        if scaler is None or _unscaled(scaler):
            return  # an optimizer was unscaled since the scaler's last update
        params = [parameters] if isinstance(parameters, torch.Tensor) else parameters
        found = self._still_scaled(params, keep=True)
        if found:
            self.said_clip = True
            max_norm = args[0] if args else kwargs.get("max_norm")
            self._say(SignalKind.SCALED_CLIP, found, {"max_norm": float(max_norm or 0)})

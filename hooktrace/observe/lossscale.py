"""Loss scaling: the ``GradScaler`` of the code that runs backward, and its scale in each
recorded step (a ``loss-scale`` signal when it changes). Until ``scaler.unscale_``, the
gradients a backward pass leaves are the true ones times that scale (65536 by default), which
``check`` divides out before judging their size."""

from __future__ import annotations

import sys
import threading
import weakref
from types import FrameType
from typing import Any

from hooktrace.hooks.owners import is_library
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

_LOOKS = 16  # recorded passes in which to look for a scaler before giving up
_SCALERS = ("GradScaler", "ShardedGradScaler")  # torch.amp's, torch.cuda.amp's, FSDP's


def _is_scaler(value: object) -> bool:
    return type(value).__name__ in _SCALERS and hasattr(value, "_scale")


def _in_frame(frame: FrameType) -> Any:
    """A scaler among the frame's variables, or the attributes of its ``self``."""
    for value in frame.f_locals.values():
        if _is_scaler(value):
            return value
    owner = frame.f_locals.get("self")
    for value in getattr(owner, "__dict__", {}).values():
        if _is_scaler(value):
            return value
    return None


def find_scaler(frame: FrameType | None) -> Any:
    """The first scaler held by the user's code on ``frame``'s stack (not the libraries')."""
    while frame is not None:
        if not is_library(frame.f_code.co_filename):
            found = _in_frame(frame)
            if found is not None:
                return found
        frame = frame.f_back
    return None


class LossScale(Observer):
    follows = ()  # no module call: only the ends of backward passes

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._scaler: weakref.ref[Any] | None = None
        self._looks = 0
        self._last: dict[int, float] = {}  # per model, the scale last written

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is not Mode.RECORDED or not end.reached:
            return
        scaler = self._find()
        if scaler is None or not scaler.is_enabled() or scaler._scale is None:
            return
        scale = float(scaler._scale)  # one read a recorded step (on a GPU, it waits for it)
        for model in sorted({info.model for info in end.reached}):
            if self._last.get(model) != scale:
                self._last[model] = scale
                self._emit(schema.Signal(end.step, model, "", SignalKind.LOSS_SCALE,
                                         {"scale": scale}))

    def _find(self) -> Any:
        scaler = self._scaler() if self._scaler is not None else None
        if scaler is not None or self._looks >= _LOOKS:
            return scaler
        self._looks += 1
        # the pass ends in the thread that called backward(), or in an engine thread while it
        # waits: look at both stacks
        main = sys._current_frames().get(threading.main_thread().ident or -1)
        scaler = find_scaler(sys._getframe()) or find_scaler(main)
        if scaler is not None:
            self._scaler = weakref.ref(scaler)
        return scaler

"""``--capture GLOB``: save the tensors of matching module calls for inspection (torch.save).

For each recorded call of a matching module:
``<log>.capture/step<S>/<model>.<fqn>.call<C>.forward.pt`` (``<model>.call<C>...`` for a model's
root) holds ``{"inputs": [...], "outputs": [...]}`` and ``...backward.pt`` holds
``{"grad_inputs": [...], "grad_outputs": [...]}``: detached CPU copies, in the order of the log's
shape lists (None where no gradient flowed), each made when the tensor is seen: the inputs as
the call begins (an in-place forward, ``ReLU(inplace=True)``, overwrites them; keyword
arguments are seen only as it ends), the outputs as it returns. The model is in the name: a
GAN's ``netG`` and ``netD`` both have a module ``0``. A name that two calls would share
(characters a file name cannot hold, made ``_``) gets ``-2``, ``-3``: no file is written over. A
size cap bounds the folder; past it, capturing stops with a note. The folder is marked as
hooktrace's, and one that is not is never touched.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import (
    BackwardStart,
    ForwardCall,
    ForwardEnd,
    ForwardStart,
    Mode,
    Observer,
    PassEnd,
)
from hooktrace.log.errors import HooktraceError
from hooktrace.log.options import selects
from hooktrace.log.writer import capture_dir

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_MARKER = ".hooktrace-capture"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "root"


def _copy(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().to("cpu", copy=True) for t in tensors]


class Capture:
    def __init__(self, log: Path, patterns: Sequence[str],
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.dir = capture_dir(log)
        self.patterns = tuple(patterns)
        self._max_bytes = max_bytes
        self._bytes = 0
        self.files = 0
        self.full = False
        self._prepared = False
        if self.dir.exists() and not (self.dir / _MARKER).exists():
            raise HooktraceError(
                f"{self.dir} exists and was not made by hooktrace; refusing to write into it")

    def prepare(self) -> None:
        """An empty folder for this run's captures: those of an earlier run of the same log go
        at the first save (a run that records nothing leaves them beside the log it keeps)."""
        if self._prepared:
            return
        self._prepared = True
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        (self.dir / _MARKER).write_text("tensors captured by hooktrace run --capture\n")

    def save(self, step: int, model: str, fqn: str, call: int, phase: str,
             tensors: Mapping[str, Sequence[torch.Tensor | None]]) -> None:
        """Save ``tensors``, copies of the call's made when they were seen (``_copy``)."""
        if self.full:
            return
        size = sum(t.numel() * t.element_size() for ts in tensors.values() for t in ts
                   if t is not None)
        if self._bytes + size > self._max_bytes:
            self.full = True
            print(f"hooktrace: --capture reached its cap ({self._max_bytes // 2**20} MB) at step "
                  f"{step}; later calls are not captured", file=sys.stderr)
            return
        self._bytes += size
        self.prepare()
        folder = self.dir / f"step{step}"
        folder.mkdir(exist_ok=True)
        data: dict[str, Any] = {"model": model, "module": fqn, "step": step, "call": call}
        data.update(tensors)
        name = _safe(model) + (f".{_safe(fqn)}" if fqn else "") + f".call{call}.{phase}"
        path, n = folder / f"{name}.pt", 1
        while path.exists():  # another module whose name is made the same
            n += 1
            path = folder / f"{name}-{n}.pt"
        torch.save(data, path)
        self.files += 1


class CaptureObserver(Observer):
    """Saves the tensors of matching calls in recorded steps: inputs as the call began (before
    an in-place op changes them), outputs, and the gradients when the backward pass ends."""

    def __init__(self, capture: Capture, model_name: Callable[[int], str]) -> None:
        self._capture = capture
        self._model_name = model_name  # a model's index -> its name in the log
        self._matches: dict[ModInfo, bool] = {}
        self._inputs: dict[ForwardStart, list[torch.Tensor | None]] = {}  # calls running
        self._grads: dict[ForwardCall, dict[str, list[torch.Tensor | None]]] = {}
        self._in_pass: list[ForwardCall] = []  # calls holding gradients to save at the pass end

    def forward_start(self, start: ForwardStart) -> None:
        if start.mode is Mode.RECORDED and not self._capture.full \
                and self._captures(start.info):
            # copied now: an in-place forward (ReLU(inplace=True)) overwrites its input
            self._inputs[start] = _copy(start.inputs)

    def forward_end(self, end: ForwardEnd) -> None:
        inputs = self._inputs.pop(end.start, None)
        if inputs is None or end.mode is not Mode.RECORDED:
            return
        call = end.call
        self._capture.save(call.step, self._model_name(call.info.model), call.info.fqn,
                           call.call_index, "forward", {
            "inputs": [*inputs, *_copy(end.kw_inputs)], "outputs": _copy(end.outputs)})
        self._grads[call] = {"grad_inputs": [None] * call.n_in,
                             "grad_outputs": [None] * call.n_out}

    def backward_start(self, start: BackwardStart) -> None:
        if start.mode is Mode.RECORDED and start.call in self._grads:
            self._in_pass.append(start.call)

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        self._keep(start, "grad_outputs", index, grad)

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        self._keep(start, "grad_inputs", index, grad)

    def _keep(self, start: BackwardStart, key: str, index: int, grad: torch.Tensor) -> None:
        saved = self._grads.get(start.call)
        if saved is not None:
            saved[key][index] = grad.detach().to("cpu", copy=True)

    def backward_end(self, end: PassEnd) -> None:
        in_pass, self._in_pass = self._in_pass, []
        for call in in_pass:
            saved = self._grads.pop(call, None)
            if saved is not None:
                self._capture.save(end.step, self._model_name(call.info.model),
                                   call.info.fqn, call.call_index, "backward", saved)

    def _captures(self, info: ModInfo) -> bool:
        if info not in self._matches:
            self._matches[info] = selects(self._capture.patterns, info.fqn, info.cls)
        return self._matches[info]

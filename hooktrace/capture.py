"""``--capture GLOB``: save the tensors of matching module calls for inspection (torch.save).

For each recorded call of a matching module: ``<log>.capture/step<S>/<fqn>.call<C>.forward.pt``
holds ``{"inputs": [...], "outputs": [...]}`` and ``...backward.pt`` holds
``{"grad_inputs": [...], "grad_outputs": [...]}``: detached CPU copies, in the order of the log's
shape lists (None where no gradient flowed). A size cap bounds the folder; past it, capturing
stops with a note. The folder is marked as hooktrace's, and one that is not is never touched.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hooktrace.errors import HooktraceError
from hooktrace.logio import capture_dir

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
        self._patterns = tuple(patterns)
        self._max_bytes = max_bytes
        self._bytes = 0
        self.files = 0
        self.full = False
        if self.dir.exists():
            if not (self.dir / _MARKER).exists():
                raise HooktraceError(
                    f"{self.dir} exists and was not made by hooktrace; refusing to write into it")
            shutil.rmtree(self.dir)  # the captures of an earlier run of the same log
        self.dir.mkdir(parents=True)
        (self.dir / _MARKER).write_text("tensors captured by hooktrace run --capture\n")

    def matches(self, fqn: str) -> bool:
        return any(fnmatch.fnmatchcase(fqn, p) for p in self._patterns)

    def save(self, step: int, fqn: str, call: int, phase: str,
             tensors: Mapping[str, Sequence[torch.Tensor | None]]) -> None:
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
        folder = self.dir / f"step{step}"
        folder.mkdir(exist_ok=True)
        data: dict[str, Any] = {"module": fqn, "step": step, "call": call}
        data.update({key: _copy(ts) for key, ts in tensors.items()})
        torch.save(data, folder / f"{_safe(fqn)}.call{call}.{phase}.pt")
        self.files += 1

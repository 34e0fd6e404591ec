"""The ways of running a step that are compared: untraced, the floor, hooktrace, and others.

Every variant is a context manager factory ``open(model, log_path)``; entering it installs the
variant's hooks, leaving it removes them. Only one is ever open at a time: each of them hooks
every module call of the process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

import hooktrace

Opener = Callable[[nn.Module, Path], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Variant:
    name: str  # key in the JSON
    label: str  # row of the table
    open: Opener
    writes_log: bool = False  # a hooktrace session: its log is summarised after each session


@contextlib.contextmanager
def untraced(model: nn.Module, log: Path) -> Iterator[None]:
    yield


def _noop_grad(grad_outputs: Any) -> None:
    return None


def _output_tensors(output: Any) -> tuple[Any, ...]:
    """Tensors of a module's output, one level deep: the least a tracer must look at."""
    if isinstance(output, torch.Tensor):
        return (output,)
    if isinstance(output, (tuple, list)):
        return tuple(output)
    if isinstance(output, dict):
        return tuple(output.values())
    return ()


@contextlib.contextmanager
def floor(model: nn.Module, log: Path) -> Iterator[None]:
    """The physical floor of module-level tracing: global forward pre/post hooks that do
    nothing, and a no-op prehook on the autograd node of each output (how a tracer learns that
    a module's backward started). Any tracer pays at least this."""

    def pre(module: nn.Module, args: Any) -> None:
        return None

    def post(module: nn.Module, args: Any, output: Any) -> None:
        for t in _output_tensors(output):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                t.grad_fn.register_prehook(_noop_grad)

    handles = [nn_module.register_module_forward_pre_hook(pre),
               nn_module.register_module_forward_hook(post)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hooktrace(stats: bool) -> Opener:
    def open_session(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
        # steps="all": every step is recorded in full (the default records 0:10, then watches)
        return hooktrace.trace(log, model=model, steps="all", stats=stats)

    return open_session


def hooktrace_watched(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
    """Watched steps, what a long run pays after its recorded ones (default ``steps="0:10"``):
    hooks and NaN/Inf checks on every module, no event written. No step here is recorded."""
    return hooktrace.trace(log, model=model, steps=str(10**9))


def module_tracker(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
    from torch.utils.module_tracker import ModuleTracker

    return ModuleTracker()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto prints two lines on file descriptor 2 per profiler session; hide them."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def profiler(model: nn.Module, log: Path) -> Iterator[torch.profiler.profile]:
    """torch.profiler with record_shapes; its trace is not exported here (see export_cost)."""
    prof = torch.profiler.profile(record_shapes=True)
    with _quiet_stderr():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)


def export_cost(step: Callable[[], None], steps: int, folder: Path) -> float:
    """Seconds to export the Chrome trace of ``steps`` profiled steps: a cost paid per export
    (it grows with the steps recorded), kept out of the step times."""
    with profiler(nn.Module(), folder) as prof:
        for _ in range(steps):
            step()
    start = time.perf_counter()
    prof.export_chrome_trace(str(folder / "profile.json"))
    seconds = time.perf_counter() - start
    (folder / "profile.json").unlink()
    return seconds


VARIANTS = (
    Variant("untraced", "untraced", untraced),
    Variant("floor", "floor (no-op hooks)", floor),
    Variant("hooktrace", "hooktrace (stats on)", _hooktrace(stats=True), writes_log=True),
    Variant("hooktrace_nostats", "hooktrace stats=False", _hooktrace(stats=False),
            writes_log=True),
    Variant("hooktrace_watched", "hooktrace, watched steps", hooktrace_watched),
    Variant("moduletracker", "ModuleTracker", module_tracker),
    Variant("profiler", "torch.profiler(record_shapes)", profiler),
)

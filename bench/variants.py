"""The ways of running a step that are compared: untraced, the floor, hooktrace, and others.

Every variant is a context manager factory ``open(model, log_path)``; entering it installs the
variant's hooks, leaving it removes them. Only one is ever open at a time: each of them hooks
every module call of the process.
"""

from __future__ import annotations

import contextlib
import math
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
from hooktrace.observe.stats import DEFER_ENV

Opener = Callable[[nn.Module, Path], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Variant:
    name: str  # key in the JSON
    label: str  # row of the table
    open: Opener
    writes_log: bool = False  # a hooktrace session: its log is summarised after each session
    only: tuple[str, ...] = ()  # the workloads it runs on (none named: all)
    cpu_only: bool = False  # left out of --device cuda runs
    extra: bool = False  # run only when asked for (--observers, --variants)

    def runs_on(self, workload: str, device: str) -> bool:
        return (not self.only or workload in self.only) and not (self.cpu_only and
                                                                  device != "cpu")


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
def _global_hooks(pre: Callable[..., None], post: Callable[..., None]) -> Iterator[None]:
    """Global forward pre and post hooks on every module call, while the block runs."""
    handles = [nn_module.register_module_forward_pre_hook(pre),
               nn_module.register_module_forward_hook(post)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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

    with _global_hooks(pre, post):
        yield


def _has_numbers(t: torch.Tensor) -> bool:
    """A non-empty floating-point tensor: what statistics are taken of."""
    return t.is_floating_point() and t.numel() > 0


def _reduce_output(t: torch.Tensor, keep: list[torch.Tensor]) -> None:
    """What a NaN/Inf check of a forward output costs at least: one sum."""
    total = torch.sum(t, dtype=torch.float32)
    if t.device.type == "cpu":
        total.item()
    else:
        keep.append(total)  # left on the device, like hooktrace's (read once per step)


def _reduce_grad(g: torch.Tensor, keep: list[torch.Tensor]) -> None:
    """What a gradient's norm and absolute max cost at least: two passes."""
    flat = g.reshape(-1)
    if g.device.type != "cpu":
        keep += [torch.linalg.vector_norm(flat), torch.linalg.vector_norm(flat, ord=math.inf)]
        return
    low, high = torch.aminmax(flat)
    max(-low.item(), high.item())
    if g.dtype is torch.float32:
        torch.dot(flat, flat).item()
    else:
        torch.linalg.vector_norm(flat, dtype=torch.float64).item()


@contextlib.contextmanager
def floor_stats(model: nn.Module, log: Path) -> Iterator[None]:
    """The floor plus the bare tensor reductions the statistics need (a sum per forward
    output, an absolute max and a norm per gradient, each gradient once), without a line of
    bookkeeping: what statistics cost at least, whoever computes them."""
    keep: list[torch.Tensor] = []  # device results; dropped now and then, never read

    def grads(grad_outputs: Any) -> None:
        for g in grad_outputs:
            if isinstance(g, torch.Tensor) and _has_numbers(g):
                _reduce_grad(g, keep)
        return None

    def pre(module: nn.Module, args: Any) -> None:
        if len(keep) > 4096:
            keep.clear()
        return None

    last: list[Any] = [None, -1]  # a parent returning its child's output: checked once

    def post(module: nn.Module, args: Any, output: Any) -> None:
        for t in _output_tensors(output):
            if isinstance(t, torch.Tensor):
                if _has_numbers(t) and (t is not last[0] or t._version != last[1]):
                    _reduce_output(t, keep)
                    last[:] = t, t._version
                node = t.grad_fn
                if node is None:
                    continue
                metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict
                if "floor_stats" not in metadata:  # one hook per node: each gradient once
                    metadata["floor_stats"] = True
                    node.register_prehook(grads)

    with _global_hooks(pre, post):
        yield


def _hooktrace(stats: bool, ops: tuple[str, ...] = ()) -> Opener:
    def open_session(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
        # steps="all": every step is recorded in full (the default records 0:10, then watches)
        return hooktrace.trace(log, model=model, steps="all", stats=stats, ops=ops)

    return open_session


@contextlib.contextmanager
def hooktrace_deferred(model: nn.Module, log: Path) -> Iterator[None]:
    """hooktrace as on a GPU, on CPU tensors (``HOOKTRACE_DEFER_STATS=1``): every number left
    in the device buffer until the step ends. On W1's small tensors, what the device path's
    bookkeeping costs the host (on a GPU a small model's step lasts as long as the host takes
    to launch its kernels)."""
    with contextlib.ExitStack() as stack:
        saved = os.environ.get(DEFER_ENV)
        os.environ[DEFER_ENV] = "1"  # read once, when the session starts
        try:
            stack.enter_context(hooktrace.trace(log, model=model, steps="all"))
        finally:
            if saved is None:
                del os.environ[DEFER_ENV]
            else:
                os.environ[DEFER_ENV] = saved
        yield


def hooktrace_watched(model: nn.Module, log: Path) -> AbstractContextManager[Any]:
    """Watched steps, what a long run pays after its recorded ones (default ``steps="0:10"``):
    hooks and NaN/Inf checks on every module, no event written. No step here is recorded."""
    return hooktrace.trace(log, model=model, steps=str(10**9))


# what --observers leaves out of a session in turn: (name in the table, observer classes)
OBSERVERS = (
    ("recorder", ("LogRecorder",)),  # the log writer: events, shapes, statistics written
    ("parameter norms", ("ParamNorms",)),
    ("parameter ledger", ("ParamLedger",)),
    ("diagnosis", ("Diagnosis", "Optimizers")),
    ("watch", ("Watch",)),
    ("loss", ("LossObserver",)),
    ("gradient zeros", ("GradZeros",)),
    ("op zoom", ("OpsObserver",)),  # what choosing modules to zoom into costs, zooming none
    ("hooks and custom Functions", ("HookCount", "FunctionCheck")),
    ("every observer", ("LogRecorder", "ParamNorms", "ParamLedger", "Diagnosis", "Optimizers",
                        "Watch", "LossObserver", "GradZeros", "OpsObserver", "HookCount",
                        "FunctionCheck")),
)


def _without(classes: tuple[str, ...], watched: bool = False) -> Opener:
    """hooktrace (statistics on; every step recorded, or with ``watched`` none: every step
    watched) with the observers of ``classes`` left out of the session (``tracer.py``
    assembles them): what they cost is the difference to the whole session. The core calls
    only the observers it is handed, so one left out costs nothing."""
    from hooktrace.hooks.core import CallTracker
    from hooktrace.hooks.records import Mode

    @contextlib.contextmanager
    def open_session(model: nn.Module, log: Path) -> Iterator[None]:
        original = CallTracker.start

        def start(self: CallTracker, naming: Any, observers: Any) -> CallTracker:
            kept = [o for o in observers if type(o).__name__ not in classes]
            for o in observers:  # made, left out: what it wrapped at its making put back
                if type(o).__name__ == "FunctionCheck" and o not in kept:
                    o.stop(0, Mode.OFF)
            return original(self, naming, kept)

        with contextlib.ExitStack() as stack:
            CallTracker.start = start  # type: ignore[method-assign]  # for this session only
            try:
                stack.enter_context(hooktrace.trace(
                    log, model=model, steps=str(10**9) if watched else "all"))
            finally:
                CallTracker.start = original  # type: ignore[method-assign]
            yield

    return open_session


def _slug(name: str) -> str:
    return name.replace(" ", "_")


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
    Variant("floor_stats", "floor + the statistics' reductions", floor_stats),
    Variant("hooktrace", "hooktrace (stats on)", _hooktrace(stats=True), writes_log=True),
    Variant("hooktrace_nostats", "hooktrace stats=False", _hooktrace(stats=False),
            writes_log=True),
    # W1 only: on bigger tensors its CPU time is the reductions' (slower on CPU than the CPU
    # path's), not the bookkeeping it is here to show; on a GPU "hooktrace" is this path
    Variant("hooktrace_deferred", "hooktrace, device path on CPU", hooktrace_deferred,
            writes_log=True, only=("W1",), cpu_only=True),
    Variant("hooktrace_watched", "hooktrace, watched steps", hooktrace_watched),
    # resnet18 with the operations of layer1's calls recorded (--ops 'layer1*'): the zoom's cost
    Variant("hooktrace_zoomed", "hooktrace --ops 'layer1*'", _hooktrace(True, ("layer1*",)),
            writes_log=True, only=("W2",)),
    Variant("moduletracker", "ModuleTracker", module_tracker),
    Variant("profiler", "torch.profiler(record_shapes)", profiler),
    # --observers: each observer left out in turn, recorded steps and watched ones
    *(Variant(f"without_{_slug(name)}", f"hooktrace without {name}", _without(classes),
              extra=True) for name, classes in OBSERVERS),
    *(Variant(f"watched_without_{_slug(name)}", f"watched, without {name}",
              _without(classes, watched=True), extra=True)
      for name, classes in OBSERVERS if name in ("watch", "every observer")),
)

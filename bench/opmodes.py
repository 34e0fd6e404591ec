"""Why the op-level zoom is a ``TorchFunctionMode``: what each kind of mode sees and costs.

    python -m bench.opmodes [--rounds 20]

On W2 (resnet18, batch 8 at 64x64, CPU, one thread) it times, interleaved, a training step
untraced; with a no-op ``TorchFunctionMode`` and a no-op ``TorchDispatchMode`` pushed for the
whole step (the least any op-level tracer built on one pays, backward included for the dispatch
mode, which also sees autograd's own ops); hooktrace recording every step (statistics on); and
hooktrace zooming into layer1's calls (``--ops 'layer1*'``) and into every call (``--ops '*'``:
each call's operations, the whole step, as TorchLens traces it). It counts the operations each
mode sees in a step, and prints a markdown table of median CPU ms and x untraced.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import hooktrace
from bench import workloads


class _CountFunctions(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.seen += 1
        return func(*args, **(kwargs or {}))


class _CountDispatch(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.seen += 1
        return func(*args, **(kwargs or {}))


def _variants(model: torch.nn.Module, folder: Path
              ) -> dict[str, Callable[[], contextlib.AbstractContextManager[Any]]]:
    log = folder / "log.jsonl"
    return {
        "untraced": contextlib.nullcontext,
        "TorchFunctionMode (no-op)": _CountFunctions,
        "TorchDispatchMode (no-op)": _CountDispatch,
        "hooktrace": lambda: hooktrace.trace(log, model=model, steps="all"),
        "hooktrace --ops 'layer1*'": lambda: hooktrace.trace(log, model=model, steps="all",
                                                              ops=["layer1*"]),
        "hooktrace --ops '*'": lambda: hooktrace.trace(log, model=model, steps="all",
                                                        ops=["*"]),
    }


def _timed(step: Callable[[], None], opener: Callable[[], Any], steps: int) -> Iterator[float]:
    with opener():
        step()  # untimed: the session's first step names the model
        for _ in range(steps):
            start = time.process_time()
            step()
            yield time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workload = workloads.build("W2", torch.device("cpu"))
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        variants = _variants(workload.model, Path(tmp))
        for _ in range(args.rounds):
            for name, opener in variants.items():
                times.setdefault(name, []).extend(_timed(workload.step, opener, 2))
    counted = {}
    for name, kind in (("functions", _CountFunctions), ("dispatched", _CountDispatch)):
        with kind() as mode:
            workload.step()
        counted[name] = mode.seen
    base = statistics.median(times["untraced"])
    print(f"W2, {args.rounds} rounds x 2 steps; operations a mode sees per step: "
          f"{counted['functions']} (function mode), {counted['dispatched']} (dispatch mode, "
          "backward included)\n")
    print("| variant | median ms | x untraced |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1e3:.2f} | "
              f"{statistics.median(t) / base:.2f}x |")


if __name__ == "__main__":
    main()

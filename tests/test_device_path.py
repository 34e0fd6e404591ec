"""The accelerator path of the statistics, run on CPU tensors (``HOOKTRACE_DEFER_STATS=1``):
no number is read per module (on a GPU each read is a device synchronisation), one transfer
brings a step's numbers to the host, and each tensor costs one or two reductions.

``aten._local_scalar_dense`` is the operator behind ``.item()``, ``float(t)`` and ``bool(t)``:
on a GPU, each call waits for the device. tests/test_gpu.py checks the same on a real GPU.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import resnet18_step
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hooktrace
from hooktrace.stats import DEFER_ENV


class CountOps(TorchDispatchMode):
    """Counts the aten operators run while it is active (the tracer's hooks included)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFER_ENV, "1")


def _counted(step: Callable[[], None]) -> Counter[str]:
    with CountOps() as mode:
        step()
    return mode.ops


def _transfers(trace: hooktrace.api.Trace) -> int:
    stats = trace._tracer._stats  # type: ignore[union-attr]
    assert stats is not None
    return stats.transfers


def test_no_number_read_per_module_and_one_transfer_per_step(tmp_path: Path) -> None:
    model, step = resnet18_step()
    untraced = _counted(step)
    assert untraced["_local_scalar_dense"] == 0  # the step itself reads no number
    ops: dict[bool, Counter[str]] = {}
    for stats in (False, True):
        with hooktrace.trace(tmp_path / f"{stats}.jsonl", model=model, steps="0:2",
                             stats=stats) as trace:
            step()
            before = _transfers(trace) if stats else 0
            ops[stats] = _counted(step)  # a recorded step
            assert (_transfers(trace) if stats else 0) - before == int(stats)
            before = _transfers(trace) if stats else 0
            watched = _counted(step)  # after --steps: anomaly checks only, the same rule
            assert (_transfers(trace) if stats else 0) - before == int(stats)
        assert ops[stats]["_local_scalar_dense"] == 0, stats
        assert watched["_local_scalar_dense"] == 0, stats
    # what the statistics cost: per forward output a sum; per gradient a norm and an absolute
    # max (resnet18: 60 module calls, each gradient reduced once though it is one module's
    # grad_output and the next's grad_input); per step one fused parameter norm and a stack
    added = ops[True].total() - ops[False].total()
    calls = 60 + 1  # modules and the root
    assert 0 < added <= 3 * calls + 10, (added, ops[True] - ops[False])
    assert ops[True]["linalg_vector_norm"] <= 2 * calls


def test_a_step_with_nan_pays_a_second_transfer(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with hooktrace.trace(tmp_path / "nan.jsonl", model=model) as trace:
        transfers = []
        for bad in (False, True, False):
            before = _transfers(trace)
            inputs = x.clone()
            if bad:
                inputs[0, 0] = math.nan
            reads = _counted(lambda: model(inputs).sum().backward())  # noqa: B023
            assert reads["_local_scalar_dense"] == 0
            transfers.append(_transfers(trace) - before)
    assert transfers == [1, 2, 1]

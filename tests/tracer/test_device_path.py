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
from helpers import events, read_log, resnet18_step
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hooktrace
from hooktrace.log import schema
from hooktrace.observe.stats import DEFER_ENV


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


def _transfers(trace: hooktrace.tracing.api.Trace) -> int:
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
    # what the statistics cost: per forward output an L1 norm; per gradient a norm and an
    # absolute max (resnet18: 60 module calls, each gradient reduced once though it is one
    # module's grad_output and the next's grad_input), each written into a slot of one buffer;
    # per step one fused parameter norm, a stack and the read. Views (detach, slice) launch
    # nothing on a device.
    added = ops[True] - ops[False]
    for view in ("detach", "slice"):
        del added[view]
    calls = 60 + 1  # modules and the root
    # and per output gradient of a module with children (root, layers, blocks, downsamples) a
    # count of its non-zero elements and its copy into the buffer (observe/gradzeros.py)
    parents = sum(1 for m in model.modules() if m._modules)
    assert added["count_nonzero"] == added["copy_"] == parents == 16, added
    assert 0 < added.total() <= 3 * calls + 2 * parents + 10, added
    assert ops[True]["linalg_vector_norm"] <= 3 * calls


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


def _deep_numbers(path: Path) -> list[Any]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(300):  # 600 module calls: past the first slots buffer (1024 numbers)
        linear = nn.Linear(16, 16)
        with torch.no_grad():  # gradients grow by 1.01 per layer: every number differs
            linear.weight.copy_(torch.eye(16) * 1.01 + torch.rand(16, 16) * 1e-3)
            linear.bias.zero_()
        layers += [linear, nn.ReLU()]
    model = nn.Sequential(*layers)
    x = torch.rand(4, 16) + 0.5
    with hooktrace.trace(path, model=model, steps="0:2"):
        for _ in range(3):  # two recorded steps, then a watched one: the buffer is reused
            model.zero_grad()
            model(x).sum().backward()
    return [(e.seq, e.fqn, e.grad_input_stats, e.grad_output_stats)
            for e in events(path, "backward") if isinstance(e, schema.BackwardEvent)]


def test_device_numbers_are_the_host_numbers(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    device = _deep_numbers(tmp_path / "device.jsonl")
    monkeypatch.delenv(DEFER_ENV)
    host = _deep_numbers(tmp_path / "host.jsonl")
    assert len(device) == len(host) == 2 * 601
    for d, h in zip(device, host, strict=True):
        assert d[:2] == h[:2]
        for d_stats, h_stats in ((d[2], h[2]), (d[3], h[3])):
            assert d_stats is not None and h_stats is not None
            for a, b in zip(d_stats, h_stats, strict=True):
                if a is None or b is None:  # the input x has no gradient
                    assert a is b is None and d[1] in ("", "0"), (d, h)
                    continue
                assert math.isclose(a[0], b[0], rel_tol=2e-3), (d, h)
                assert a[1] == b[1], (d, h)


def _partly_read(path: Path) -> tuple[list[int], int, list[tuple[int, int, Any]]]:
    """Three steps of a loss that reads one column of a model's output (a partly-zero gradient
    reaching the root, not its inner Sequential): the transfers of each step, the numbers read
    in them, and the log's grad-zeros signals."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 4))
    x = torch.randn(3, 4)
    transfers, reads = [], 0
    with hooktrace.trace(path, model=model, steps="0:2") as trace:
        for _ in range(3):  # two recorded steps, then a watched one
            before = _transfers(trace)
            reads += _counted(lambda: model(x)[:, :1].sum().backward())["_local_scalar_dense"]
            transfers.append(_transfers(trace) - before)
    found = [(s.step, s.model, s.detail["share"]) for s in read_log(path)
             if isinstance(s, schema.Signal) and s.kind == "grad-zeros"]
    return transfers, reads, found


def test_grad_zeros_on_the_device_path_in_the_step_s_one_transfer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The share of exactly-zero elements in the gradients reaching modules with children
    (``observe/gradzeros.py``) is counted on the device path too, into the statistics' buffer:
    the same signals as the host path's, no number read per module, one transfer a step."""
    transfers, reads, device = _partly_read(tmp_path / "device.jsonl")
    assert (transfers, reads) == ([1, 1, 1], 0)
    monkeypatch.delenv(DEFER_ENV)
    _, _, host = _partly_read(tmp_path / "host.jsonl")
    # the root's output: 3 of its 4 columns unread; the inner Sequential's, read in full
    assert [(step, model, list(share.values())) for step, model, share in host] == [
        (0, 0, [0.75]), (1, 0, [0.75])]
    assert device == host

"""On a CUDA device: statistics stay on the device until the step ends (no synchronisation per
module), equal the CPU's, and NaN/Inf is still found, in full and in watched steps.

Skipped without a GPU (CI has none); run where one is: ``python -m pytest tests/test_gpu.py``.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SAMPLES, events, hooktrace_cmd, read_log, resnet18_step
from torch import nn

import hooktrace
from hooktrace.log import schema
from hooktrace.log.errors import NonFiniteError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


def backward(log: Path, step: int | None = None) -> list[schema.BackwardEvent]:
    return [e for e in events(log, "backward", step) if isinstance(e, schema.BackwardEvent)]


def count_syncs(fn: Callable[[], object]) -> int:
    """How many synchronising CUDA calls ``fn`` makes: torch's sync debug mode warns on each."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("stats", [True, False])
def test_no_sync_per_module(log_path: Path, stats: bool) -> None:
    """resnet18 (60 modules, 120+ events a step): at most one synchronisation per step, for the
    step's numbers; none at all with statistics off. The same in watched steps (after --steps)."""
    model, step = resnet18_step("cuda", size=64)
    step()  # cuDNN picks its algorithms here, untraced
    untraced = count_syncs(step)
    with hooktrace.trace(log_path, model=model, steps="0:3", stats=stats) as trace:
        step()  # the first traced step names the model and may synchronise more
        recorded = [count_syncs(step) for _ in range(2)]
        watched = [count_syncs(step) for _ in range(2)]
    assert trace.steps == 5
    extra = 1 if stats else 0  # the step's one transfer
    assert all(n <= untraced + extra for n in recorded + watched), (untraced, recorded, watched)
    seen = backward(log_path, step=2)
    assert len(seen) > 60
    if stats:  # the numbers did arrive, after the step
        assert all(s is not None and math.isfinite(s[0])
                   for e in seen for s in e.grad_output_stats or [])


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _train(model: nn.Module, device: torch.device, log: Path) -> None:
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    with hooktrace.trace(log, model=model):
        for _ in range(3):
            x = torch.randn(8, 16).to(device)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()


def test_statistics_equal_the_cpu(tmp_path: Path) -> None:
    model = _mlp()
    _train(copy.deepcopy(model), torch.device("cpu"), tmp_path / "cpu.jsonl")
    _train(model, CUDA, tmp_path / "cuda.jsonl")
    cpu, gpu = backward(tmp_path / "cpu.jsonl"), backward(tmp_path / "cuda.jsonl")
    assert [(e.step, e.fqn) for e in cpu] == [(e.step, e.fqn) for e in gpu]
    compared = 0
    for a, b in zip(cpu, gpu, strict=True):
        for sa, sb in zip([*(a.grad_input_stats or []), *(a.grad_output_stats or [])],
                          [*(b.grad_input_stats or []), *(b.grad_output_stats or [])], strict=True):
            assert (sa is None) == (sb is None)
            if sa is not None and sb is not None:
                assert len(sb) == 2  # finite: no NaN/Inf counts
                assert sb == pytest.approx(sa, rel=2e-3), (a.step, a.fqn)
                compared += 1
    assert compared >= 3 * 5
    params = [[r.grad_norm for r in read_log(log) if isinstance(r, schema.ParamGrads)]
              for log in (tmp_path / "cpu.jsonl", tmp_path / "cuda.jsonl")]
    assert len(params[0]) == 3 and params[0][0].keys() == params[1][0].keys()
    for a, b in zip(*params, strict=True):
        for key, norm in a.items():
            assert b[key] == pytest.approx(norm, rel=2e-3)


def _grad_zeros(device: torch.device, log: Path) -> tuple[int, list[tuple[int, Any]]]:
    """Two steps of a loss that reads one column of the output: the synchronisations of the
    second, and the grad-zeros signals (the share of the root's output gradient that is 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 4)).to(device)
    x = torch.randn(3, 4, device=device)
    def step() -> None:
        model(x)[:, :1].sum().backward()

    with hooktrace.trace(log, model=model):
        step()
        syncs = 0
        if device == CUDA:  # the second step: its synchronisations counted
            syncs = count_syncs(step)
        else:
            step()
    return syncs, [(r.step, r.detail) for r in read_log(log)
                   if isinstance(r, schema.Signal) and r.kind == "grad-zeros"]


def test_grad_zeros_on_cuda(tmp_path: Path) -> None:
    """The grad-zeros signal (observe/gradzeros.py) on a GPU: counted into the statistics'
    buffer, read with the step's numbers (one synchronisation), the same as on the CPU."""
    _, cpu = _grad_zeros(torch.device("cpu"), tmp_path / "cpu.jsonl")
    syncs, gpu = _grad_zeros(CUDA, tmp_path / "cuda.jsonl")
    assert syncs <= 1
    assert gpu == cpu and [list(d["share"].values()) for _, d in cpu] == [[0.75], [0.75]]


def _check(log: Path) -> set[tuple[str, str, int]]:
    result = hooktrace_cmd("check", log, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    return {(f["cause"], f["module"], f["step"]) for f in report["findings"]
            if f["severity"] == "error"}


def test_nan_sample_on_cuda(tmp_path: Path) -> None:
    log = tmp_path / "nan.jsonl"
    result = hooktrace_cmd("run", "-o", log, SAMPLES / "nan_layer.py", "--device", "cuda")
    assert result.returncode == 0, result.stderr
    assert ("nonfinite-forward", "compress", 3) in _check(log)
    # the counts, reduced on the device, arrived: the NaN output's count, a NaN gradient's
    [forward] = [e for e in events(log, "forward", step=3)
                 if isinstance(e, schema.ForwardEvent) and e.fqn == "compress"]
    assert forward.output_nonfinite and forward.output_nonfinite[0][1] > 0
    grads = [s for e in backward(log, step=3) for s in e.grad_output_stats or []
             if s is not None and not math.isfinite(s[0])]
    assert grads and all(len(s) == 4 and s[2] + s[3] > 0 for s in grads)


def test_late_nan_in_a_watched_step_on_cuda(tmp_path: Path) -> None:
    log = tmp_path / "long.jsonl"
    result = hooktrace_cmd("run", "-o", log, SAMPLES / "long_run.py", "--device", "cuda",
                           "--steps", "300", "--nan-step", "250", "--print-every", "1000")
    assert result.returncode == 0, result.stderr
    assert ("nonfinite-forward", "norm", 250) in _check(log)


def test_break_on_nan_on_cuda(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to(CUDA)
    x = torch.randn(2, 4, device=CUDA)
    x[0, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"0 \(Linear\) produced NaN/Inf at step 0"), \
            hooktrace.trace(log_path, model=model, break_on="nan"):
        model(x).sum().backward()

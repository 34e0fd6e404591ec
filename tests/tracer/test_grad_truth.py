"""What the log says about gradients agrees with PyTorch's own answer (``param.grad``), on the
patterns that once broke it: an in-place op on a module output that views a whole tensor
(``F.linear`` on a 3-d input), and random-drop layers judged by their own drop probability."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from groundtruth import Case, run_case, sgd
from helpers import events, names
from torch import nn
from torch.nn import functional as F
from torchvision.ops import StochasticDepth

import hooktrace
from hooktrace.check.checklog import run_checks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import field_names


class BiasTable(nn.Module):
    """Swin V2's continuous position bias: an MLP applied to a buffer of coordinates, its first
    Linear's output (a view: the input is 4-d) modified in place by ReLU(inplace=True)."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.register_buffer("coords", torch.randn(1, 5, 5, 2))
        self.mlp = nn.Sequential(nn.Linear(2, 16), nn.ReLU(inplace=inplace), nn.Linear(16, 3))
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.mlp(self.coords).mean()
        return self.proj(x) + bias


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).sum().backward()


def test_in_place_op_on_a_whole_view_keeps_the_gradient(log_path: Path) -> None:
    torch.manual_seed(0)
    model = BiasTable()
    reference = copy.deepcopy(model)
    reference.mlp[1].inplace = False
    x = torch.randn(4, 8)
    with hooktrace.trace(log_path, model=model):
        _step(model, x)
    # the first Linear's output view was rebuilt by the in-place ReLU: its backward still shows
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    assert {"mlp", "mlp.0", "mlp.1", "mlp.2"} <= set(bwd)
    assert model.mlp[0].weight.grad is not None and model.mlp[0].weight.grad.abs().sum() > 0
    # the gradient reaching mlp.0's output, in its own shape, as an out-of-place ReLU gets it
    out: list[torch.Tensor] = []

    def keep(module: nn.Module, args: object, output: torch.Tensor) -> None:
        output.retain_grad()
        out.append(output)

    reference.mlp[0].register_forward_hook(keep)
    _step(reference, x)
    [stat] = bwd["mlp.0"].grad_output_stats or [None]
    assert bwd["mlp.0"].grad_output_shapes == [[1, 5, 5, 16]]
    assert stat is not None
    assert out[0].grad is not None
    assert stat[0] == pytest.approx(out[0].grad.norm().item(), rel=1e-3)  # the log keeps 4 digits
    assert not run_checks(log_path).problems


def test_whole_views_keep_the_backward_order(log_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 2))
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    # Flatten's output views the pool's whole output: its backward still starts first
    assert names(log_path, "backward") == ["", "3", "2", "1", "0"]


class DropBlocks(nn.Module):
    """Residual blocks behind stochastic depth (row mode: one draw a sample)."""

    def __init__(self, p: float, blocks: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(blocks))
        self.drops = nn.ModuleList(StochasticDepth(p, "row") for _ in range(blocks))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block, drop in zip(self.blocks, self.drops, strict=True):
            x = x + drop(block(x))
        return self.head(x)


def _drop_steps(model: DropBlocks, steps: int, batch: int) -> None:
    for _ in range(steps):
        model(torch.randn(batch, 8)).sum().backward()


def test_chance_drops_are_not_reported(log_path: Path) -> None:
    # p = 0.5 at batch 2: a block drops the whole batch a quarter of the time; over 12 blocks
    # some block drops in each step, and its zero gradient is the layer doing its job
    torch.manual_seed(0)
    model = DropBlocks(0.5)
    with hooktrace.trace(log_path, model=model, steps="0:3"):
        _drop_steps(model, 3, batch=2)
    report = run_checks(log_path)
    assert not [f for f in report.findings if f.cause == "zero-gradient"]
    # the drops happened: the log shows blocks with an exactly-zero gradient
    zero = [e for e in events(log_path, "backward") if e.fqn.startswith("drops.")
            and e.grad_input_stats and e.grad_input_stats[0] and e.grad_input_stats[0][0] == 0]
    assert zero


def test_a_drop_probability_of_one_is_reported(log_path: Path) -> None:
    torch.manual_seed(0)
    model = DropBlocks(1.0, blocks=2)
    with hooktrace.trace(log_path, model=model, steps="0:2"):
        _drop_steps(model, 2, batch=2)
    found = [f for f in run_checks(log_path).problems if f.cause == "zero-gradient"]
    assert [f.module for f in found] == ["drops.0", "drops.1"]
    assert "its drop probability is 1: it drops every input" in found[0].message
    assert "its drop probability is 1" in found[0].hint


def test_drops_chance_cannot_explain_are_reported(log_path: Path) -> None:
    # p = 0.1 at batch 8: a whole drop has a chance of 1e-8 a call; a layer that drops in every
    # call is not that layer's chance (here: p set after the log named it 0.1)
    torch.manual_seed(0)
    model = DropBlocks(0.1, blocks=1)
    with hooktrace.trace(log_path, model=model, steps="0:2"):
        _drop_steps(model, 1, batch=8)
        model.drops[0].p = 1.0
        _drop_steps(model, 1, batch=8)
    [found] = [f for f in run_checks(log_path).problems if f.cause == "zero-gradient"]
    assert found.module == "drops.0"
    assert "1 whole drop in 2 calls" in found.message


def test_a_whole_view_used_beside_its_base_keeps_its_own_gradient(log_path: Path) -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.flat = nn.Conv2d(1, 2, 3), nn.Flatten()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            return 2 * self.flat(h).sum() + h.pow(2).sum()  # the base has a gradient of its own

    model = Both()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 1, 5, 5)).backward()
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    [stat] = bwd["flat"].grad_output_stats or [None]
    assert stat is not None
    assert stat[0] == pytest.approx(2 * (2 * 2 * 3 * 3) ** 0.5, rel=1e-3)  # 2 everywhere


def test_a_position_bias_called_several_times_agrees_with_param_grad(tmp_path: Path) -> None:
    """swin V2's position bias on a buffer, ``ReLU(inplace=True)`` between its Linears, called
    several times a step (tests/scripts/field_names.py): each claim of the log and of check
    against PyTorch's own ``param.grad``, over two steps."""
    torch.manual_seed(0)
    model = field_names.Recurrent()
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))

    def backward() -> None:
        F.cross_entropy(model(x), y).backward()

    result = run_case(tmp_path / "log.jsonl", Case([model], backward, sgd([model])), 2)
    assert not result.failures(), result.failures()

"""The numerical check of custom ``autograd.Function``s (``observe/functions.py``) on real
Functions, and that tracing with it changes nothing: same losses and gradients bit for bit,
the same random numbers after, ``Function.apply`` PyTorch's own again at the end."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import read_log
from torch import nn
from torch.autograd import Function
from torch.nn import functional as F

import hooktrace
from hooktrace.check import loop
from hooktrace.log import schema
from hooktrace.observe import functions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import blind_bugs5 as blind
import hook_function_cases as cases

APPLY = Function.__dict__["apply"]


def _input(nonnegative: bool = False) -> torch.Tensor:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    return (x.relu() if nonnegative else x).requires_grad_()


@pytest.mark.parametrize(("fn", "args", "verdict"), [
    (blind.ISRLURight, (), None),
    (blind.ISRLUWrong, (), "ignores-grad"),
    (blind.MulConstantWrong, (0.01,), "scaled"),
    (cases.SigmoidWrong, (), "mismatch"),
    (blind.GradReverse, (), "modifier"),
    (cases.GradMultiply, (0.1,), "modifier"),
    (cases.RoundSTE, (), "surrogate"),
])
def test_the_verdicts(fn: Any, args: tuple[Any, ...], verdict: str | None) -> None:
    """The tracer measures; check's ``loop.verdict`` says what the measurements mean."""
    found = functions.check_function(fn, (_input(), *args))
    assert (None if found is None else loop.verdict(found)) == verdict
    assert found is None or "verdict" not in found


def test_a_kink_the_inputs_sit_on_is_skipped() -> None:
    """A leaky ReLU on a ReLU's output: at the exact zeros its two one-sided slopes differ
    (1 and 0.1); compared there, the central difference (0.55) would disagree with the
    backward's 0.1. Those elements are left out, the others agree; and a leaky ReLU on inputs
    it leaves unchanged is not an identity (a gradient modifier)."""
    assert functions.check_function(cases.LeakyReLU, (_input(nonnegative=True),)) is None
    found = functions.check_function(cases.SigmoidWrong, (_input(nonnegative=True),))
    assert found is not None and loop.verdict(found) == "mismatch"


def test_the_check_leaves_the_inputs_and_the_random_numbers_alone() -> None:
    x = _input()
    torch.manual_seed(5)
    torch.rand(3)
    before = x.detach().clone(), x._version, torch.get_rng_state()
    assert functions.check_function(blind.MulConstantWrong, (x, 0.01)) is not None
    assert torch.equal(x, before[0]) and x._version == before[1] and x.grad is None
    assert torch.equal(torch.get_rng_state(), before[2])


class Noisy(Function):
    """A forward that draws random numbers (a noise layer), with the right backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand_like(x)
        ctx.save_for_backward(noise)
        return x * noise

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (noise,) = ctx.saved_tensors
        return grad * noise


def steps(model: nn.Module, traced: Path | None) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with hooktrace.trace(traced, model=model) if traced else contextlib.nullcontext():
        for _ in range(3):
            opt.zero_grad()
            x = torch.randn(8, 8)
            loss = F.cross_entropy(model(x), torch.randint(0, 4, (8,)))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters() if p.grad is not None]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> Any:
        h = Noisy.apply(self.body(x))
        return self.head(blind.MulConstantWrong.apply(h, 0.5))


def test_tracing_with_the_check_changes_nothing(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Net()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    plain = steps(model, None)
    model.load_state_dict(state)
    log = tmp_path / "t.jsonl"
    traced = steps(model, log)
    assert traced[0] == plain[0]
    assert all(torch.equal(a, b) for a, b in zip(traced[1], plain[1], strict=True))
    assert Function.__dict__["apply"] is APPLY
    signals = [r for r in read_log(log) if isinstance(r, schema.Signal)
               and r.kind == "function-backward"]
    # the noise layer is right (its draws are the same in every run of the check)
    assert [(s.detail["function"], loop.verdict(s.detail)) for s in signals] == [
        ("MulConstantWrong", "scaled")]


def test_apply_is_pytorchs_own_outside_recorded_steps(tmp_path: Path) -> None:
    """The wrapper lives in recorded steps only: a watched step (and torch.compile, which
    watched steps may run) calls PyTorch's own ``Function.apply``."""
    now = [0]  # the step running
    seen: dict[int, set[bool]] = {}  # per step: was apply PyTorch's own (the check's calls too)

    class Probe(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            seen.setdefault(now[0], set()).add(Function.__dict__["apply"] is APPLY)
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    layer = nn.Linear(3, 3)
    with hooktrace.trace(tmp_path / "t.jsonl", model=layer, steps="0:2"):
        for step in range(4):  # steps 0 and 1 recorded, 2 and 3 watched
            now[0] = step
            Probe.apply(layer(torch.randn(2, 3))).sum().backward()
    assert seen == {0: {False}, 1: {False}, 2: {True}, 3: {True}}
    assert Function.__dict__["apply"] is APPLY

"""Hooks that pile up and custom autograd code (issue 36, item 3): bugs and healthy look-alikes
beside blind set 5's, one per CASE (argv[1]).

    python hook_function_cases.py CASE

Each trains a tiny model on random data for a few steps on the CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 6


class Net(nn.Module):
    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.act = act

    def forward(self, x: torch.Tensor) -> Any:
        h = F.relu(self.body(x))
        return self.head(self.act(h) if self.act is not None else h)


def train(model: nn.Module, before: Callable[[int], None] | None = None,
          after: Callable[[int], None] | None = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        if before is not None:
            before(step)
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if after is not None:
            after(step)


# --- bugs ---------------------------------------------------------------------------------------

def backward_hook_every_step() -> None:
    """A full backward hook that logs the head's gradient, registered every step."""
    model = Net()
    seen: list[float] = []
    train(model, before=lambda _: model.head.register_full_backward_hook(
        lambda m, gi, go: seen.append(float(go[0].norm()))))


class SigmoidWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (s,) = ctx.saved_tensors
        return grad * s  # the bug: the derivative is s * (1 - s)


def sigmoid_backward_wrong() -> None:
    """A custom sigmoid whose backward forgets the ``1 - s`` factor."""
    train(Net(SigmoidWrong.apply))


# --- healthy look-alikes ------------------------------------------------------------------------

def ok_hook_per_epoch_removed() -> None:
    """A gradient hook registered at the start of each epoch (two steps) and removed at its
    end: the count stays at one."""
    model = Net()
    handles: list[Any] = []

    def begin(step: int) -> None:
        if step % 2 == 0:
            handles.extend(p.register_hook(lambda g: g * 0.5) for p in model.body.parameters())

    def end(step: int) -> None:
        if step % 2 == 1:
            for h in handles:
                h.remove()
            handles.clear()

    train(model, before=begin, after=end)


class LeakyReLU(torch.autograd.Function):
    """A leaky ReLU: a kink at 0, which the ReLU before it hits exactly at many elements (there
    the central difference is 0.55, the backward's convention 0.1)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.where(x > 0, x, 0.1 * x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.where(x > 0, 1.0, 0.1)


def ok_function_with_kink() -> None:
    """A correct Function with a kink at 0, used on a ReLU's output (exact zeros)."""
    train(Net(LeakyReLU.apply))


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad  # straight through: the forward's gradient is 0 almost everywhere


def ok_straight_through() -> None:
    """Quantisation with a straight-through estimator: the backward is not the forward's
    gradient, on purpose (a note)."""
    train(Net(RoundSTE.apply))


class GradMultiply(torch.autograd.Function):
    """fairseq's: the identity forward, the gradient scaled in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.new(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def ok_grad_multiply() -> None:
    """The body's gradient scaled by 0.1 through an identity Function (a note)."""
    train(Net(lambda h: GradMultiply.apply(h, 0.1)))


BUGS: tuple[Callable[[], None], ...] = (backward_hook_every_step, sigmoid_backward_wrong)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_hook_per_epoch_removed, ok_function_with_kink, ok_straight_through, ok_grad_multiply,
)

if __name__ == "__main__":
    torch.manual_seed(0)
    {case.__name__: case for case in BUGS + HEALTHY}[sys.argv[1]]()

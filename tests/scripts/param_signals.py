"""Look-alikes of the parameter bugs in blind_bugs.py (a weight read through ``.data``, gradients
zeroed before the step, a parameter created in forward): healthy ones (``ok_*``) that must stay
silent, and one more way to zero the gradients. One per CASE (argv[1]), tiny, CPU, seeded."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 4


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(16, 8), torch.randint(0, 3, (16,))


def train(model: nn.Module, steps: int = STEPS) -> None:
    x, y = data()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


# the bug: zero_grad(set_to_none=False) between backward and step
def zero_grad_between() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        F.cross_entropy(model(x), y).backward()
        optimizer.zero_grad(set_to_none=False)
        optimizer.step()


# healthy: a Linear whose bias is frozen (requires_grad False)
def ok_frozen_bias() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model[2].bias.requires_grad_(False)
    train(model)


# healthy: LoRA-style, a frozen weight with trainable adapters (B starts at zero)
class LoraLinear(nn.Linear):
    def __init__(self, a: int, b: int, rank: int = 2) -> None:
        super().__init__(a, b)
        self.weight.requires_grad_(False)
        self.bias.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, a) * 0.1)
        self.lora_b = nn.Parameter(torch.zeros(b, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight + self.lora_b @ self.lora_a, self.bias)


def ok_lora() -> None:
    train(nn.Sequential(LoraLinear(8, 16), nn.ReLU(), LoraLinear(16, 3)))


# healthy: the output layer's weight tied to the input embedding's
class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(3, 8)
        self.body = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.out.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.body(x)) + self.embed(torch.zeros_like(x[:, 0]).long()))


def ok_weight_tying() -> None:
    train(Tied())


# healthy: a module that replaces a buffer at every call, and weight normalisation done right
class RunningCenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.utils.parametrizations.weight_norm(nn.Linear(8, 16))
        self.register_buffer("center", torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.center = h.mean(dim=0).detach()  # a new buffer object each call
        return h - self.center


def ok_buffer_replaced() -> None:
    train(nn.Sequential(RunningCenter(), nn.ReLU(), nn.Linear(16, 3)))


# healthy: a parameter built lazily at the first call (a dry run), before the optimizer
class LazyScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.scale: nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.scale is None:
            self.scale = nn.Parameter(torch.ones(h.shape[1]))
        return h * self.scale


def ok_lazy_param() -> None:
    model = nn.Sequential(LazyScale(), nn.ReLU(), nn.Linear(16, 3))
    model(data()[0]).sum().backward()  # dry run: builds the scale
    model.zero_grad()
    train(model)


# healthy: a batch whose loss is multiplied by 0 (skipped, ranks kept in step), zero_grad kept
# as zeros (set_to_none=False) in its right place, and gradient accumulation
def ok_zero_loss_batch() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        optimizer.zero_grad(set_to_none=False)
        for half in (0, 1):
            loss = F.cross_entropy(model(x[half::2]), y[half::2]) / 2
            (loss * (0.0 if step == 0 else 1.0)).backward()
        optimizer.step()


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in [
    zero_grad_between, ok_frozen_bias, ok_lora, ok_weight_tying, ok_buffer_replaced,
    ok_lazy_param, ok_zero_loss_batch]}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()

"""Training loops whose weights never change (``weights-unchanged``), and healthy ones that
look alike: ``python weights_loop.py CASE``."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
X, Y = torch.randn(32, 10), torch.randint(0, 3, (32,))


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def train(model: nn.Module, optimizer: torch.optim.Optimizer | None, steps: int = 5,
          every: int = 1, scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
    for i in range(steps):
        loss = F.cross_entropy(model(X), Y) / every
        loss.backward()
        if optimizer is not None and (i + 1) % every == 0:
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()


def no_step() -> None:
    """The bug: zero_grad and backward each step, optimizer.step() forgotten."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        F.cross_entropy(model(X), Y).backward()


def lr_zero() -> None:
    """The bug: a learning rate of 0 (read from a config that meant 'default')."""
    model = mlp()
    train(model, torch.optim.SGD(model.parameters(), lr=0.0))


def lr_tiny() -> None:
    """The bug: a learning rate far below what float32 weights can take (1e-12)."""
    model = mlp()
    train(model, torch.optim.SGD(model.parameters(), lr=1e-12))


def ok_warmup() -> None:
    """Healthy: a warmup schedule whose first step has a learning rate of 0."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / 3))
    train(model, optimizer, scheduler=warmup)


def ok_accumulate() -> None:
    """Healthy: gradient accumulation, an optimizer step every 3 micro-batches."""
    model = mlp()
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=9, every=3)


def ok_manual_sgd() -> None:
    """Healthy: no optimizer, the update written by hand."""
    model = mlp()
    for _ in range(5):
        model.zero_grad()
        F.cross_entropy(model(X), Y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad  # type: ignore[operator]


def ok_small_lr() -> None:
    """Healthy: fine-tuning with Adam at 1e-6."""
    model = mlp()
    train(model, torch.optim.Adam(model.parameters(), lr=1e-6))


def ok_gradients_summed() -> None:
    """Healthy: gradients summed over batches, never cleared, no optimizer (a Fisher estimate)."""
    model = mlp()
    for _ in range(4):
        F.cross_entropy(model(X), Y).backward()


def saliency() -> None:
    """An analysis, no training: input gradients of a model in eval mode, no optimizer."""
    model = mlp().eval()
    for _ in range(4):
        x = X.clone().requires_grad_(True)
        model(x)[:, 0].sum().backward()


if __name__ == "__main__":
    globals()[sys.argv[1]]()

"""The small training loop the step's tests trace (``test_step_explained``, ``test_step_moves``):
an MLP, its loss on a random batch, and ``n`` textbook steps with hooks between backward and
the optimizer's step, and after it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def loss(model: nn.Module) -> torch.Tensor:
    return F.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 4, (8,)))


def steps(model: nn.Module, opt: torch.optim.Optimizer, n: int,
          between: Callable[[], Any] | None = None,
          after: Callable[[], Any] | None = None) -> None:
    """zero_grad, forward, backward, ``between``, step, ``after``: ``n`` times."""
    for _ in range(n):
        opt.zero_grad()
        loss(model).backward()
        if between is not None:
            between()
        opt.step()
        if after is not None:
            after()

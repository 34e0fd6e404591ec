"""Cheap looks at parameters for the diagnosis observer: an optimizer's parameters, one int per
module that changes with any of its own parameters, its count of trainable ones, and whether
gradients are all exactly zero (read on the host only)."""

from __future__ import annotations

import torch
from torch import nn

from hooktrace.observe.stats import on_host


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def ids_sum(module: nn.Module) -> int:
    """The ids of a module's own parameters (and Nones), summed: one int that changes with any
    of them."""
    return sum(map(id, module._parameters.values()))


def trainable_count(module: nn.Module) -> int:
    """How many of a module's own parameters require a gradient."""
    return sum(1 for p in module._parameters.values() if p is not None and p.requires_grad)


def all_zero(grads: list[torch.Tensor]) -> bool:
    """Tensor by tensor until one is not zero, the last layers' first (the likeliest to be
    non-zero), where that reads no device (``stats.on_host``); elsewhere not checked: a read per
    optimizer step would wait for the device (weights-unchanged tells the same bug there)."""
    return on_host(grads) and not any(g.any() for g in reversed(grads))

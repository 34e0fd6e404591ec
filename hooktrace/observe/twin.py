"""A copy of a model to measure on (``--probe``), also where ``copy.deepcopy`` refuses one."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

_OWN = ("_parameters", "_buffers", "_modules")  # what the copy always has of its own


def twin_of(model: nn.Module) -> nn.Module:
    """A deep copy of ``model``; where one fails (a recurrent state or an attention cache kept
    on a module with its autograd history, which deepcopy refuses; a lock, a file or a data
    loader held as an attribute), the copy detaches those tensors and shares the objects that
    cannot be copied: the weights, buffers and modules are still the copy's own."""
    try:
        return copy.deepcopy(model)
    except Exception:
        pass
    memo: dict[int, Any] = {}
    for m in model.modules():
        for name, value in vars(m).items():
            if name in _OWN or id(value) in memo:
                continue
            if isinstance(value, torch.Tensor):
                if not value.is_leaf:
                    memo[id(value)] = value.detach().clone()
                continue
            try:
                copy.deepcopy(value)
            except Exception:
                memo[id(value)] = value  # shared with the model: the probe does not change it
    return copy.deepcopy(model, memo)

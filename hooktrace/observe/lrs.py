"""The parameter ledger's learning rates: per optimizer that stepped, the largest learning rate of
its groups at each step, after which backward pass it stepped, and its weight decay where the
step multiplies each weight by ``1 - lr * weight_decay``; written when tracing stops as one
``optimizer-lrs`` signal per optimizer. Facts only: whether a schedule collapsed or a decay
shrinks every weight is ``check``'s to say (``check/updates.py``).

A long run keeps a bounded sample, as the loss ledger does (``lossvalues.Thinned``), evenly
spread over the run, the last step always kept. Cost: a few floats per optimizer step, read from its
``param_groups`` (a tensor learning rate, capturable and maybe on a device, is not read).
"""

from __future__ import annotations

from typing import Any

import torch

from hooktrace.observe.lossvalues import Thinned

#: optimizers whose weight decay multiplies each weight by 1 - lr * weight_decay (and any group
#: with ``decoupled_weight_decay``); Adam's coupled decay is scaled by its normalisation
_SHRINKING = {"SGD", "AdamW"}


class Lrs:
    """One optimizer's learning rates so far (kept past the optimizer: a training function's
    optimizer is gone when tracing stops)."""

    def __init__(self, optimizer: torch.optim.Optimizer, models: list[int]) -> None:
        self.cls = type(optimizer).__name__
        self.models = models  # those its parameters belong to, at its first step
        #: the backward pass each step came after, and the largest numeric lr of its groups
        #: (None: none)
        self.lrs = Thinned()
        self.decay: dict[str, Any] | None = None  # the largest lr x weight_decay, where first

    def stepped(self, optimizer: torch.optim.Optimizer, after: int) -> None:
        groups = optimizer.param_groups
        numbers = [float(g["lr"]) for g in groups if isinstance(g.get("lr"), (int, float))]
        lr = max(numbers) if numbers else None
        self.lrs.add(after, lr)
        shrinking = self.cls in _SHRINKING
        for g in groups:
            lr_g, wd = g.get("lr"), g.get("weight_decay")
            if (shrinking or g.get("decoupled_weight_decay")) and isinstance(
                    lr_g, (int, float)) and isinstance(wd, (int, float)) and lr_g * wd > (
                    self.decay["lr"] * self.decay["weight_decay"] if self.decay else 0):
                self.decay = {"step": after, "lr": float(lr_g), "weight_decay": float(wd)}

    def detail(self) -> dict[str, Any]:
        after, lr = self.lrs.pairs()
        detail: dict[str, Any] = {"optimizer": self.cls, "models": self.models,
                                  "count": self.lrs.count, "every": self.lrs.every,
                                  "after": after, "lr": lr}
        if self.decay is not None:
            detail["decay"] = self.decay
        return detail

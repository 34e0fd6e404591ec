"""The parameter ledger's learning rates: per optimizer that stepped, the largest learning rate of
its groups at each step, after which backward pass it stepped, and its weight decay where the
step multiplies each weight by ``1 - lr * weight_decay``; written when tracing stops as one
``optimizer-lrs`` signal per optimizer. Facts only: whether a schedule collapsed or a decay
shrinks every weight is ``check``'s to say (``check/updates.py``).

A long run keeps a bounded sample, as the loss ledger does (``lossvalues.py``): past ``_KEEP``
steps every other one is kept and the sample is taken half as often, evenly spread over the run;
the last step is always kept. Cost: a few floats per optimizer step, read from its
``param_groups`` (a tensor learning rate, capturable and maybe on a device, is not read).
"""

from __future__ import annotations

from typing import Any

import torch

_KEEP = 256  # steps kept per optimizer, at most
#: optimizers whose weight decay multiplies each weight by 1 - lr * weight_decay (and any group
#: with ``decoupled_weight_decay``); Adam's coupled decay is scaled by its normalisation
_SHRINKING = {"SGD", "AdamW"}


class Lrs:
    """One optimizer's learning rates so far (kept past the optimizer: a training function's
    optimizer is gone when tracing stops)."""

    def __init__(self, optimizer: torch.optim.Optimizer, models: list[int]) -> None:
        self.cls = type(optimizer).__name__
        self.models = models  # those its parameters belong to, at its first step
        self.after: list[int] = []  # the backward pass each kept step came after
        self.lr: list[float | None] = []  # the largest numeric lr of its groups (None: none)
        self.every = 1  # one step in ``every`` is kept
        self.count = 0
        self.last: tuple[int, float | None] = (0, None)
        self.decay: dict[str, Any] | None = None  # the largest lr x weight_decay, where first

    def stepped(self, optimizer: torch.optim.Optimizer, after: int) -> None:
        groups = optimizer.param_groups
        numbers = [float(g["lr"]) for g in groups if isinstance(g.get("lr"), (int, float))]
        lr = max(numbers) if numbers else None
        self.last = (after, lr)
        if self.count % self.every == 0:
            self.after.append(after)
            self.lr.append(lr)
            if len(self.lr) > _KEEP:
                self.after, self.lr = self.after[::2], self.lr[::2]
                self.every *= 2
        self.count += 1
        shrinking = self.cls in _SHRINKING
        for g in groups:
            lr_g, wd = g.get("lr"), g.get("weight_decay")
            if (shrinking or g.get("decoupled_weight_decay")) and isinstance(
                    lr_g, (int, float)) and isinstance(wd, (int, float)) and lr_g * wd > (
                    self.decay["lr"] * self.decay["weight_decay"] if self.decay else 0):
                self.decay = {"step": after, "lr": float(lr_g), "weight_decay": float(wd)}

    def detail(self) -> dict[str, Any]:
        after, lr = list(self.after), list(self.lr)
        if (self.count - 1) % self.every:  # the last step was not sampled: kept as well
            after.append(self.last[0])
            lr.append(self.last[1])
        detail: dict[str, Any] = {"optimizer": self.cls, "models": self.models,
                                  "count": self.count, "every": self.every, "after": after,
                                  "lr": lr}
        if self.decay is not None:
            detail["decay"] = self.decay
        return detail

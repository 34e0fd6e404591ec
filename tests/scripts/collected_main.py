"""Training that lives in ``main()``, its model held by a reference cycle (a trainer object the
model points back to), the garbage collector run at the end of ``main``: the model and its
optimizer are gone when ``hooktrace run`` stops tracing. ``keep`` keeps them in a global until
the script ends, for the same run with everything alive at stop
(``findings/test_collected_before_stop.py``).

    python collected_main.py [keep | again]

Its bugs: the neck left out of the optimizer's param groups, StepLR meant per epoch stepped per
batch (an EMA copy of the model, never called, beside it). ``again`` first trains a model of the
same class healthily (every parameter held) in a function whose model the collector frees: the
buggy model's parameters then take the freed ones' ids.
"""

from __future__ import annotations

import copy
import gc
import sys

import torch
from torch import nn
from torch.nn import functional as F

KEPT: list[object] = []


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.neck = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.neck(self.backbone(x))))


class Trainer:
    """Holds the model, which holds it back: only the garbage collector frees them."""

    def __init__(self, model: Net, neck: bool = False) -> None:
        self.model = model
        model.trainer = self  # type: ignore[assignment]  # a plain attribute: the cycle
        params = [*model.backbone.parameters(), *model.head.parameters()]  # no neck
        if neck:
            params += model.neck.parameters()
        self.opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.1)
        self.ema = copy.deepcopy(model).requires_grad_(False)

    def step(self) -> None:
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()
        self.sched.step()  # per batch: meant per epoch
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)


def train(trainer: Trainer) -> Trainer:
    for _ in range(6):
        trainer.step()
    return trainer


def main(keep: bool) -> None:
    trainer = train(Trainer(Net()))
    if keep:
        KEPT.append(trainer)
    del trainer
    gc.collect()
    print("main: done, collected" if not keep else "main: done, kept")


if __name__ == "__main__":
    torch.manual_seed(0)
    if sys.argv[1:] == ["again"]:
        train(Trainer(Net(), neck=True))
        gc.collect()
    main(keep=sys.argv[1:] == ["keep"])

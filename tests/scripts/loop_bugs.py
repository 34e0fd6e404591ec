"""Training-loop bugs from the PyTorch forums, one per CASE (argv[1]), and healthy look-alikes.

    python loop_bugs.py CASE

Each case trains a small MLP (``model``) for 4 steps on random data; the bug is in the loop
around it, not in the model. The ``ok_`` cases look like a bug and are not.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.block = Block()
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.block(self.stem(x))))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 8), torch.randint(0, 4, (8,))


def step(model: nn.Module, optimizer: torch.optim.Optimizer, zero: bool = True) -> None:
    x, y = batch()
    if zero:
        optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def validate(model: nn.Module, train_again: bool) -> None:
    model.eval()
    with torch.no_grad():
        model(batch()[0])
    if train_again:
        model.train()


def main() -> None:
    case = sys.argv[1]
    torch.manual_seed(0)
    model = Net()
    if case == "backward_hook":  # the bug: the deprecated hook sees the last op (the ReLU)
        model.block.register_backward_hook(lambda module, gin, gout: None)
    if case == "frozen_bn":  # the bug: a frozen block whose BatchNorm still updates
        model.block.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if case == "not_optimized":  # the bug: a layer swapped in after the optimizer was built
        model.head = nn.Linear(16, 4)
    for i in range(4):
        if case == "loss_detached":  # the bug: the loss rebuilt from a number
            x, y = batch()
            value = F.cross_entropy(model(x), y).item()
            optimizer.zero_grad()
            torch.tensor(value, requires_grad=True).backward()
            optimizer.step()
        elif case == "ok_accumulation":  # zero_grad once per 2 micro-batches: right
            x, y = batch()
            F.cross_entropy(model(x), y).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
        else:
            step(model, optimizer, zero=case != "no_zero_grad")
        if i == 1 and case in ("eval_backward", "ok_validation"):
            validate(model, train_again=case == "ok_validation")
    print(f"{case}: trained 4 steps")


if __name__ == "__main__":
    main()

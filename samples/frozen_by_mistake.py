"""Defect sample: one layer of a stack left frozen ("forgot to unfreeze").

A stack of four identical Linear layers is frozen for a warm-up phase and then unfrozen for
training, but the unfreeze loop skips ``layers.2``: it keeps requires_grad=False while its
three siblings train.

    hooktrace run -o frozen.jsonl samples/frozen_by_mistake.py
    hooktrace check frozen.jsonl       # frozen (warning): layers.2
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Stack(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Stack()
    model.layers.requires_grad_(False)  # warm-up: train the head only (not shown)
    for i, layer in enumerate(model.layers):
        if i != 2:  # the bug: an index filter left over from an experiment
            layer.requires_grad_(True)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 32)
        target = torch.randint(0, 4, (args.batch_size,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

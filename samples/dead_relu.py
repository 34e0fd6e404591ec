"""Defect sample: a ReLU that dies, and takes every layer before it with it.

A classifier whose hidden layer ends in a bias initialised far negative (a copy-paste from a
"bias = -1e2 keeps it sparse" tip): every pre-activation of ``act2`` is negative, the ReLU passes
back an exactly-zero gradient, and nothing before it ever trains. The loss still moves (the
head trains), so nothing looks wrong from the outside.

    hooktrace run -o dead_relu.jsonl samples/dead_relu.py
    hooktrace check dead_relu.jsonl     # dead-activation: act2, the layers before it starved
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(64, 64)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(64, 3)
        nn.init.constant_(self.fc2.bias, -100.0)  # the bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.fc2(self.act1(self.fc1(x)))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x, y = torch.randn(16, 20), torch.randint(0, 3, (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

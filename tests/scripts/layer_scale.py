"""Residual blocks whose branch is scaled by a learnt layer scale initialised tiny (1e-8 here;
ConvNeXt's is 1e-6), trained for 3 steps: the branch's parameter gradients are tiny by design,
while the gradient reaches the stem through the shortcut. Each block also registers a Dropout
it never calls (as EfficientNet's blocks do their StochasticDepth).

``--no-shortcut`` drops the shortcut: then the gradient truly vanishes before the stem.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, shortcut: bool) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.gamma = nn.Parameter(torch.full((width,), 1e-8))
        self.drop = nn.Dropout(0.1)  # built, never called
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.gamma * self.mlp(x)
        return x + branch if self.shortcut else branch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-shortcut", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), *(Block(16, not args.no_shortcut) for _ in range(3)),
                          nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
    for step in range(3):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

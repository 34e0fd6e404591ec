"""Defect sample: exploding gradients in a deep plain MLP with a too-large initialisation.

30 Linear(32, 32) layers, no activation, no normalisation, no residual connections, initialised
with std ``--gain``/sqrt(32) (default gain 2; a stable init would use gain 1). Each layer
multiplies the backward gradient by about ``gain``, so the gradient reaching the first layers is
~2**29 times the one leaving the loss. Gradient clipping keeps the run finite (without it the
second SGD step overflows to inf), but it only hides the problem: hooktrace records the gradients
before clipping.

    hooktrace run -o exploding.jsonl samples/exploding.py
    hooktrace check exploding.jsonl    # exploding
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn


class DeepMLP(nn.Module):
    def __init__(self, depth: int, width: int, gain: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))
        for layer in self.layers:
            nn.init.normal_(layer.weight, std=gain / math.sqrt(width))  # the bug: gain too large
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--gain", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = DeepMLP(args.depth, 32, args.gain)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 32)
        target = torch.randint(0, 32, (args.batch_size,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # hides the explosion from the update
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()

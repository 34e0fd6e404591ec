"""Defect sample: a registered submodule that forward never calls.

``aux_head`` was meant for an auxiliary loss that was later removed; it is still registered
(so it is in ``model.parameters()``, the optimizer and the checkpoint, and DDP waits for its
gradients) but forward never calls it.

    hooktrace run -o unused.jsonl samples/unused_module.py
    hooktrace check unused.jsonl       # unused (warning): aux_head
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)
        self.aux_head = nn.Linear(32, 2)  # the bug: registered, never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16)
        target = torch.randint(0, 4, (args.batch_size,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

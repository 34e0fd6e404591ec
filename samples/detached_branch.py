"""Defect sample: a branch cut off from the gradient by a stray ``.detach()``.

Two branches read the same input and their outputs are summed. ``branch_b``'s output is
detached in forward (left over from debugging), so its Linear layers run forward every step but
never receive a gradient: they never train.

    hooktrace run -o detached.jsonl samples/detached_branch.py
    hooktrace check detached.jsonl     # no-grad: branch_b.0 and branch_b.2, step 0
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch_a = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.branch_b = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch_a(x)
        b = self.branch_b(x).detach()  # the bug: no gradient flows back into branch_b
        return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TwoBranch()
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

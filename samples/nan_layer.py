"""Defect sample: a layer that starts producing NaN at step 3.

``LogCompress`` compresses features with log(1 + x). From step ``--nan-step`` on (default 3) a
"refactoring" makes it compute log(x - 1) instead, which is NaN for the many inputs below 1
(ReLU outputs are mostly small): the first NaN of the run is in ``compress``'s output. The loss
and every gradient of that step are NaN, and the SGD update spreads NaN into the weights, so
later steps are NaN from ``fc1`` on.

    hooktrace run -o nan.jsonl samples/nan_layer.py
    hooktrace check nan.jsonl          # nonfinite-forward: compress, step 3
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class LogCompress(nn.Module):
    def __init__(self, nan_step: int) -> None:
        super().__init__()
        self.nan_step = nan_step
        self.step = 0  # set by the training loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step >= self.nan_step:
            return torch.log(x - 1)  # the bug: NaN wherever x < 1
        return torch.log1p(x)


class MLP(nn.Module):
    def __init__(self, nan_step: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.compress = LogCompress(nan_step)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.compress(self.act(self.fc1(x))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--nan-step", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (same data on each)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP(args.nan_step).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        model.compress.step = step
        x = torch.randn(args.batch_size, 16).to(args.device)
        target = torch.randint(0, 4, (args.batch_size,)).to(args.device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

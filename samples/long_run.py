"""A long run that goes wrong late: NaN appears at step ``--nan-step`` (default 1800) of 2000.

A tiny regression MLP trains for ``--steps`` steps (batch 4). ``norm`` divides its input by a
running scale that a "warm-up schedule" bug drives to zero at step ``--nan-step``: from then on
it divides by 0 (and later by a negative root), so its output is NaN/Inf and the run is ruined.

Made for tracing long runs: record the first steps in full and only anomalies afterwards.

    hooktrace run -o long.jsonl samples/long_run.py
    hooktrace check long.jsonl         # nonfinite-forward: norm, step 1800
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class ScheduledNorm(nn.Module):
    """Divides by sqrt(scale); scale follows a schedule that (wrongly) reaches 0 at ``zero_at``."""

    def __init__(self, zero_at: int) -> None:
        super().__init__()
        self.zero_at = zero_at
        self.step = 0  # set by the training loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if self.step < self.zero_at else self.zero_at - self.step  # the bug
        return x / torch.sqrt(torch.tensor(float(scale), device=x.device))


class Regressor(nn.Module):
    def __init__(self, nan_step: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.norm = ScheduledNorm(nan_step)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.act(self.fc1(x))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--nan-step", type=int, default=1800)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--print-every", type=int, default=100)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (same data on each)")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    model = Regressor(args.nan_step).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    true_w = torch.randn(8, 1).to(args.device)
    for step in range(args.steps):
        model.norm.step = step
        x = torch.randn(args.batch_size, 8).to(args.device)
        y = x @ true_w
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % args.print_every == 0 or step == args.nan_step or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""A small deterministic training run for ``hooktrace diff``; each switch changes one thing,
as run B of a comparison would.

    --lr 0.2          another learning rate
    --extra           one more layer (``extra``) between fc1 and fc2
    --batch 6         another batch size
    --nan-step 3      ``poison`` outputs NaN from that step on
    --bf16            the model runs under bfloat16 autocast (CPU)
    --rename          fc2 is called ``head``
    --swap            ``act`` runs before fc1 (another order; other shapes)
    --twice           ``act`` is called twice (more calls of one module)
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Poison(nn.Module):
    """The identity, until ``step`` reaches ``nan_step``: then NaN."""

    def __init__(self, nan_step: int) -> None:
        super().__init__()
        self.nan_step, self.step = nan_step, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float("nan") if 0 <= self.nan_step <= self.step else x


class Net(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.poison = Poison(args.nan_step)
        self.extra = nn.Linear(16, 16) if args.extra else None
        setattr(self, "head" if args.rename else "fc2", nn.Linear(16, 4))
        self.last = self.head if args.rename else self.fc2
        self.swap, self.twice = args.swap, args.twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.act(x)) if self.swap else self.act(self.fc1(x))
        h = self.poison(self.act(h) if self.twice else h)
        if self.extra is not None:
            h = self.extra(h)
        return self.last(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--nan-step", type=int, default=-1)
    parser.add_argument("--extra", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--rename", action="store_true")
    parser.add_argument("--swap", action="store_true")
    parser.add_argument("--twice", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        model.poison.step = step
        torch.manual_seed(100 + step)
        x, target = torch.randn(args.batch, 8), torch.randn(args.batch, 4)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            out = model(x)
        F.mse_loss(out.float(), target).backward()
        optimizer.step()


if __name__ == "__main__":
    main()

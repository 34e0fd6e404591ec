"""Bugs whose module is known and whose operation is what a user needs, one per CASE (argv[1]),
and healthy look-alikes (``ok_`` cases).

    python op_bugs.py CASE [STEPS]

Each case trains a small model for STEPS (default 4) steps of SGD on fixed random batches. The
line of the operation at fault ends with a comment ``# CASE``, for the tests to find.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn


class PercentileClip(nn.Module):
    """Clips at the batch's percentiles, through numpy, then scales: the numpy round trip."""

    def __init__(self, back: bool = True) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(8))
        self.back = back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().cpu().numpy()  # numpy_clip numpy_out
        lo, hi = np.percentile(a, 5), np.percentile(a, 95)
        clipped = torch.from_numpy(np.clip(a, lo, hi)).to(x.dtype)
        return clipped * self.gain if self.back else clipped


class Gate(nn.Module):
    """A sigmoid gate clamped in place: its backward needs the sigmoid's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.fc(x))  # inplace_sigmoid
        s.clamp_(0.05, 0.95)  # inplace_clamp
        return x * s


class Head(nn.Module):
    """A head with a function that is NaN/Inf on part of its inputs."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.case = case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.case == "nan_log":
            return torch.log(y)  # nan_log
        if self.case == "nan_sqrt":
            return y.sqrt()  # nan_sqrt
        if self.case == "inf_exp":
            return torch.exp(y * 200.0)  # inf_exp
        if self.case == "nan_div":
            z = y * 0
            return z / z.sum(-1, keepdim=True)  # nan_div
        if self.case in ("sqrt_at_zero", "ok_distance"):
            d = y[:, None, :] - y[None, :, :]  # each row's distance to each: 0 to itself
            if self.case == "ok_distance":
                return torch.sqrt((d * d).sum(-1) + 1e-12)
            return torch.sqrt((d * d).sum(-1))  # sqrt_at_zero
        if self.case == "where_unsafe":
            return torch.where(y > 0, torch.sqrt(y), torch.zeros_like(y))  # where_unsafe
        if self.case == "ok_where_safe":
            return torch.where(y > 0, torch.sqrt(y.clamp(min=1e-6)), torch.zeros_like(y))
        return y


class Block(nn.Module):
    """A main path and a branch whose gradient the forward stops or zeroes."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.main = nn.Linear(8, 8)
        self.branch = nn.Linear(8, 8)
        self.case = case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.branch(x)
        if self.case == "mul_zero":
            b = b * 0.0  # mul_zero
        elif self.case == "mask":
            keep = (x.abs() > 1e6).float()
            b = b * keep  # mask
        elif self.case == "round":
            b = torch.round(b)  # round
        elif self.case == "no_grad_block":
            with torch.no_grad():
                b = b * 2  # no_grad_block
        elif self.case == "ok_straight_through":
            b = b + (torch.round(b) - b).detach()
        elif self.case == "ok_mask":
            b = b * (x > 0).float()
        return self.main(x) + b


class Picker(nn.Module):
    """Picks a table row by the argmax of scores: an integer, no gradient to the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, 4)
        self.table = nn.Embedding(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = self.score(x).argmax(-1)  # argmax
        return x + self.table(idx)


class Logged(nn.Module):
    """Healthy: numpy and argmax for a metric it keeps, the output differentiable."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.seen: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.seen.append(float(y.detach().cpu().numpy().mean()))
        self.seen.append(float(y.argmax(-1).float().mean().item()))
        return torch.relu_(y * 1.0)


class Net(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 8)
        mid: nn.Module = nn.Identity()
        if case.startswith("numpy"):
            mid = PercentileClip(back=case == "numpy_clip")
        elif case == "inplace_clamp":
            mid = Gate()
        elif case in ("mul_zero", "mask", "round", "no_grad_block", "ok_straight_through",
                      "ok_mask"):
            mid = Block(case)
        elif case == "argmax":
            mid = Picker()
        elif case == "ok_logged":
            mid = Logged()
        self.mid = mid
        self.head = Head(case)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.enc(x)))


CASES = ["numpy_clip", "numpy_out", "inplace_clamp", "nan_log", "nan_sqrt", "inf_exp", "nan_div",
         "sqrt_at_zero", "where_unsafe", "mul_zero", "mask", "round", "no_grad_block", "argmax",
         "ok_where_safe", "ok_distance", "ok_straight_through", "ok_mask", "ok_logged",
         "ok_plain"]


def main() -> None:
    case = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    if case not in CASES:
        raise SystemExit(f"unknown case {case!r}")
    torch.manual_seed(0)
    net = Net(case)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batches = [torch.randn(16, 8) for _ in range(steps)]
    for step, x in enumerate(batches):
        opt.zero_grad()
        loss = net(x).nan_to_num().pow(2).mean()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

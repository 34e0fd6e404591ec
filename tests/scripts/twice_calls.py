"""A module called twice in one forward, whose second call gets no gradient back (issue 36,
item 5): healthy where its result is only looked at, a bug where it reaches the output without
gradient. Run as ``python twice_calls.py CASE``; ``hooktrace run`` traces it."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class Twice(nn.Module):
    """``body`` called on a noisy copy of the input (it trains) and on the input itself, whose
    result ``second`` does something with; ``second`` returns the forward's output."""

    def __init__(self, second: Callable[[Twice, torch.Tensor, torch.Tensor], torch.Tensor]
                 ) -> None:
        super().__init__()
        self.body = mlp()
        self.second = second
        self.clean: torch.Tensor | float = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x + 0.1 * torch.randn_like(x))
        return self.second(self, out, x)


def kept_on_self(m: Twice, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    m.clean = m.body(x).detach()  # the loop logs it after the step
    return out


def item(m: Twice, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    m.clean = m.body(x).abs().mean().item()
    return out


def under_no_grad(m: Twice, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        m.clean = m.body(x).norm()
    return out


def added_detached(m: Twice, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out + m.body(x.flip(0)).detach()  # the bug: meant to train on both


def cat_detached(m: Twice, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    both = torch.cat([out, m.body(x.flip(0)).detach()], dim=1)  # the bug: a detached half
    return F.linear(both, torch.eye(4).repeat(1, 2))


CASES: dict[str, Callable[[Twice, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "added_detached": added_detached,
    "cat_detached": cat_detached,
    "ok_kept_on_self": kept_on_self,
    "ok_item": item,
    "ok_under_no_grad": under_no_grad,
}


def main() -> None:
    torch.manual_seed(0)
    model = Twice(CASES[sys.argv[1]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        print(f"clean output: {float(torch.as_tensor(model.clean).norm()):.3f}")


if __name__ == "__main__":
    main()

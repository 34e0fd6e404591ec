"""A tiny training loop: STEPS (argv[1], default 3) steps of a 3-layer MLP on random data."""

import sys
from collections import OrderedDict

import torch
from torch import nn


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    net = nn.Sequential(OrderedDict(fc1=nn.Linear(4, 8), act=nn.ReLU(), fc2=nn.Linear(8, 2)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(5, 4)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained {steps} steps")


if __name__ == "__main__":
    main()

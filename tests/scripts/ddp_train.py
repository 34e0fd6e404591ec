"""A tiny DDP training run for torchrun (gloo, CPU). With --diverge R, rank R takes an extra
branch at step 2 (the usual cause of DDP hangs); find_unused_parameters keeps it running."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.extra = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, detour: bool = False) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if detour:
            h = h + self.extra(h)
        return self.fc2(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--diverge", type=int, default=-1)
    args = parser.parse_args()
    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if ddp else 0
    torch.manual_seed(0)
    net = Net()
    model = DistributedDataParallel(net, find_unused_parameters=True) if ddp else net
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        torch.manual_seed(step)
        x = torch.randn(4, 8)
        opt.zero_grad()
        loss = model(x, detour=(rank == args.diverge and step == 2)).pow(2).mean()
        loss.backward()
        opt.step()
    print(f"rank {rank} done")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

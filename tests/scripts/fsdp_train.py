"""A tiny FSDP2 (``fully_shard``) training run for torchrun (gloo, CPU). Parameters and their
gradients are DTensors, each rank holding a shard. Rank 0 prints the full gradient norm of
each sharded Linear per step (a collective every rank takes part in), for the test to compare
with the shard norms in the ranks' logs."""

import json

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own batch
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for step in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        norms = {}
        for name in ("0", "2"):
            grads = [p.grad.full_tensor() for p in model.get_submodule(name).parameters()]
            norms[name] = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item()
        if dist.get_rank() == 0:
            print(json.dumps({"step": step, "norms": norms}), flush=True)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

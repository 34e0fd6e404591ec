"""Healthy: a validation metric computed on a deep copy of the model, with autograd on.

Looks like: a second model that runs forward every few steps, builds a graph (no
``torch.no_grad()``), never runs backward and is never stepped; its parameters never get a
gradient. It is an evaluation copy (``copy.deepcopy(model)``, as an EMA or SWA snapshot is
often made) whose accuracy is read with ``.item()``; forgetting no_grad costs memory, not
correctness. The real model trains normally.

Asserts: the training loss falls, the copy's accuracy rises, and the copy never has a .grad.

Mirrors: b04 (evaluation forwards). Source: the copies ``torch.optim.swa_utils.AveragedModel``
makes with ``deepcopy`` (https://pytorch.org/docs/stable/optim.html#weight-averaging-swa-and-ema).
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, xv = torch.randn(640, 10), torch.randn(256, 10)
    y, yv = x[:, :4].argmax(1), xv[:, :4].argmax(1)
    losses, accs = [], []
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == 29:
            eval_model = copy.deepcopy(model)
            eval_model.eval()
            acc = (eval_model(xv).argmax(1) == yv).float().mean().item()  # graph built, unused
            accs.append(acc)
            assert all(p.grad is None for p in eval_model.parameters())
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert sum(losses[-5:]) < sum(losses[:5])
    assert accs[-1] > accs[0]


if __name__ == "__main__":
    main()

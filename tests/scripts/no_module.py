"""Trains a linear model written with plain tensors and torch.nn.functional: no nn.Module
anywhere, yet backward() runs each step. With ``--no-backward``: evaluates only."""

import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
w = torch.randn(2, 4, requires_grad=True)
b = torch.zeros(2, requires_grad=True)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = F.cross_entropy(F.linear(x, w, b), y)
    if "--no-backward" in sys.argv:
        continue
    loss.backward()
    with torch.no_grad():
        for p in (w, b):
            p -= 0.1 * p.grad
            p.grad = None
    print(f"step {step} loss {loss.item():.4f}")

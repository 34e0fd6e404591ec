"""Bug: learning rate 1e1 where 1e-3 was meant: the loss climbs 1000x and never becomes NaN.

A config typo (``lr: 1e1`` for ``1e-3``) gives Adam a step of ~10 per weight per update. Adam's
step size does not depend on the gradient's scale, so nothing overflows: the weights jump to
magnitudes of ~100, the logits to ~1e5, and the cross-entropy rises from ~1.1 to over 1e3 and
stays there, finite, while every gradient stays finite and non-zero.

Asserts: the loss rises more than 1000x above its start and stays finite at every step.

Source: https://datascience.stackexchange.com/questions/73797/why-is-my-loss-increasing-in-gradient-descent
(the loss increases as soon as the learning rate is too large).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e1)  # BUG: meant 1e-3
    x = torch.randn(640, 20)
    y = x[:, :3].argmax(1)
    losses = []
    for step in range(20):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4g}")
    assert all(math.isfinite(v) for v in losses)
    assert max(losses[5:]) > 1000 * losses[0], losses
    print("lr 1e1: the loss went up more than 1000x without a NaN")


if __name__ == "__main__":
    main()

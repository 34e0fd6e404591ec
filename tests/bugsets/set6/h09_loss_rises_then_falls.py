"""Healthy: a loss that rises for the first few steps, then falls well below its start.

Looks like: divergence: the loss goes up for several consecutive steps right after training
starts. It is momentum SGD with a schedule that warms up to a peak and then decays: the first
updates overshoot along the steepest direction (the loss climbs for a few steps), the
momentum settles and the decaying learning rate brings the loss far below its start. Nothing
is NaN and every gradient is well behaved.

Asserts: the loss peaks above 1.3x its start within the first 10 steps, and ends below 0.5x
its start.

Mirrors: b03 (a loss going up). Source: https://github.com/RUCAIBox/NCL/issues/29 (a loss that
rises early in training and then falls again: "this is normal").
"""
import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.15, momentum=0.9)
    peak, total = 5, 40
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / peak if s < peak else max(0.02, 1 - (s - peak) / 30))
    x = torch.randn(512, 8)
    y = x[:, :2].sum(1, keepdim=True)
    losses = []
    for step in range(total):
        idx = torch.arange(step * 32, step * 32 + 32) % 512
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        print(f"step {step:2d} lr {optimizer.param_groups[0]['lr']:.3f} loss {loss.item():.4f}")
    assert max(losses[:10]) > 1.3 * losses[0], losses[:10]
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses[-5:]


if __name__ == "__main__":
    main()

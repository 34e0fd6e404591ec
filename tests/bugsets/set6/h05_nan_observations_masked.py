"""Healthy: regression on sensor readings with missing (NaN) targets, masked out of the loss.

Looks like: a module whose output holds NaN in every step (``target_norm``, a normaliser with
fixed statistics applied to the raw targets, which contain NaN where a sensor was offline),
and a loss computed from a tensor with NaN in it. The mask ``~torch.isnan(target)`` selects
only the observed entries before the loss; the NaN never reaches the loss, the backward or the
weights. The model's own input has no NaN.

Asserts: target_norm's output has NaN at every step, the loss and all gradients are finite,
and the loss falls.

Mirrors: b10, b11 (NaN in data, inf in a target). Source:
https://github.com/pytorch/pytorch/issues/64305 (NaNs propagating to grad unless they are removed
before the loss) and https://github.com/chemprop/chemprop/issues/960 (NaN targets set to 0 and
masked).
"""
import torch
from torch import nn


class TargetNorm(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, y):
        return (y - self.mean) / self.std


def main():
    torch.manual_seed(0)
    x = torch.randn(640, 6)
    y = torch.stack([x[:, 0] * 3 + 5, x[:, 1] - 2 * x[:, 2]], 1)
    y[torch.rand(640, 2) < 0.15] = float("nan")  # sensor offline
    target_norm = TargetNorm(torch.nanmean(y, 0), torch.tensor([3.0, 2.2]))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(40):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        target = target_norm(y[idx])
        assert torch.isnan(target).any()
        observed = ~torch.isnan(target)
        pred = model(x[idx])
        loss = ((pred - torch.nan_to_num(target)) ** 2)[observed].mean()
        optimizer.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f} observed {observed.float().mean():.2f}")
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


if __name__ == "__main__":
    main()

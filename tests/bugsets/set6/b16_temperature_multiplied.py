"""Bug: the InfoNCE temperature multiplies the similarities instead of dividing them.

``logits = sim * tau`` with ``tau = 0.07`` (it should be ``sim / tau``): cosine similarities in
[-1, 1] become logits in [-0.07, 0.07], the softmax over 63 candidates is nearly uniform, the
loss sits at ln(63) = 4.14 and its gradient is ~200x smaller than intended (0.07 instead of
1 / 0.07). The encoder barely moves; nothing is None, zero or NaN.

Asserts: the loss stays within 0.1 of ln(2N - 1) at every step.

Source: https://github.com/sthalles/SimCLR/issues/33 (InfoNCE loss: how the logits are built and
scaled) and https://github.com/KevinMusgrave/pytorch-metric-learning/issues/6 (NT-Xent's
temperature-scaled similarities).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

TAU = 0.07


def info_nce(z1, z2):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z1.shape[0]
    logits = (z @ z.t()) * TAU  # BUG: / TAU
    logits.fill_diagonal_(float("-inf"))
    labels = (torch.arange(2 * n) + n) % (2 * n)
    return F.cross_entropy(logits, labels)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(30):
        x = torch.randn(32, 32)
        v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
        optimizer.zero_grad()
        loss = info_nce(model(v1), model(v2))
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
        assert abs(loss.item() - math.log(63)) < 0.1
    print("the temperature multiplies: the softmax is uniform and the loss stays at ln 63")


if __name__ == "__main__":
    main()

"""Healthy: a triplet-loss embedding net with ``F.normalize(z, dim=1)`` and a margin that most
triplets satisfy after a few steps.

Looks like: a loss that is exactly zero for most triplets (the hinge is flat there), so the
gradient reaching the network comes from a shrinking minority of the batch and may be zero in
some steps; outputs of unit norm that no layer produced; three forward calls per step.

Asserts: the embeddings have unit norm, an embedding does not depend on its batch, and the
loss falls.

Mirrors: b14 (normalised over the batch). Source:
https://github.com/KevinMusgrave/pytorch-metric-learning (embeddings L2-normalised per sample
before a TripletMarginLoss).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=1)


def main():
    torch.manual_seed(0)
    model = Embedder()
    criterion = nn.TripletMarginLoss(margin=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    centers = torch.randn(8, 20) * 2
    losses = []
    for step in range(25):
        cls = torch.randint(0, 8, (32,))
        neg = (cls + torch.randint(1, 8, (32,))) % 8
        a = centers[cls] + 0.3 * torch.randn(32, 20)
        p = centers[cls] + 0.3 * torch.randn(32, 20)
        n = centers[neg] + 0.3 * torch.randn(32, 20)
        optimizer.zero_grad()
        loss = criterion(model(a), model(p), model(n))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        q = centers[:1]
        alone = model(torch.cat([q, torch.randn(7, 20)]))[0]
        other = model(torch.cat([q, torch.randn(31, 20)]))[0]
        norms = model(torch.randn(32, 20)).norm(dim=1)
    assert torch.allclose(alone, other, atol=1e-5)
    assert torch.allclose(norms, torch.ones(32), atol=1e-5)
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()

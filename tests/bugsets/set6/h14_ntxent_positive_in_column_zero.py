"""Healthy: SimCLR NT-Xent with ``labels = torch.zeros(2N)``, each row's positive gathered into
column 0 first (as sthalles/SimCLR does).

Looks like: a cross-entropy whose target is class 0 for every sample of the batch, a
similarity matrix sliced with a boolean mask, and logits concatenated from two parts. The
positives are moved to column 0 and the negatives follow, so class 0 is the positive of every
row: this is correct.

Asserts: the loss falls, positive pairs end more similar than unrelated samples.

Mirrors: b15 (zeros labels with positives left in place). Source:
https://github.com/sthalles/SimCLR/issues/29 and https://github.com/sthalles/SimCLR/issues/16
(why the labels are all zeros).
"""
import torch
import torch.nn.functional as F
from torch import nn


def nt_xent(z1, z2, tau=0.5):
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.t()
    pair = (torch.arange(2 * n) + n) % (2 * n)
    positives = sim[torch.arange(2 * n), pair][:, None]
    keep = ~torch.eye(2 * n, dtype=torch.bool)
    keep[torch.arange(2 * n), pair] = False
    negatives = sim[keep].view(2 * n, -1)
    logits = torch.cat([positives, negatives], 1) / tau
    return F.cross_entropy(logits, torch.zeros(2 * n, dtype=torch.long))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        x = torch.randn(32, 32)
        v1, v2 = x + 0.3 * torch.randn_like(x), x + 0.3 * torch.randn_like(x)
        optimizer.zero_grad()
        loss = nt_xent(model(v1), model(v2))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        x = torch.randn(64, 32)
        a = F.normalize(model(x + 0.3 * torch.randn_like(x)), dim=1)
        b = F.normalize(model(x + 0.3 * torch.randn_like(x)), dim=1)
        pos = (a * b).sum(1).mean().item()
        neg = (a @ b.t()).masked_select(~torch.eye(64, dtype=torch.bool)).mean().item()
    assert sum(losses[-5:]) < sum(losses[:5])
    assert pos > neg + 0.3, (pos, neg)


if __name__ == "__main__":
    main()

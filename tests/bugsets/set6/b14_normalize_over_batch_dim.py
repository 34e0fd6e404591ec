"""Bug: embeddings L2-normalised over the batch (``F.normalize(z, dim=0)``) in a triplet model.

The embedding net ends with ``F.normalize(z, dim=0)``: each feature column is scaled to unit
norm across the batch instead of each sample's vector to unit norm. A sample's embedding now
depends on the other samples in its batch (and on the batch size); distances in the triplet
loss are ~1/sqrt(batch) of what the margin assumes, so almost every triplet violates the
margin, and at test time a query's embedding changes with whatever it is batched with.

Asserts: the embedding of the same sample changes when the rest of its batch changes, and the
embeddings do not have unit norm.

Source: https://github.com/alireza-nasiri/SoundCLR/issues/4 (F.normalize with dim=0 normalises
along the batch axis) and https://github.com/gabeur/mmt/issues/1 (wrong dimension for L2
normalization).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=0)  # BUG: dim=1


def main():
    torch.manual_seed(0)
    model = Embedder()
    criterion = nn.TripletMarginLoss(margin=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    centers = torch.randn(8, 20) * 2
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
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        q = centers[:1]
        alone = model(torch.cat([q, torch.randn(7, 20)]))[0]
        other = model(torch.cat([q, torch.randn(31, 20)]))[0]
        norms = model(torch.randn(32, 20)).norm(dim=1)
    assert not torch.allclose(alone, other, atol=1e-3)
    assert not torch.allclose(norms, torch.ones(32), atol=0.05)
    print("each embedding depends on the rest of its batch")


if __name__ == "__main__":
    main()

"""Bug: SimCLR NT-Xent over the full similarity matrix with ``labels = torch.zeros(2N)``.

The loss builds the (2N, 2N) cosine-similarity matrix of two views, masks the diagonal, and
copies ``labels = torch.zeros(2 * N)`` from an implementation that had first moved each row's
positive into column 0. Here the positives stay where they are (row i's positive is column
(i + N) mod 2N), so every row is told that its positive is sample 0 (view 1): the encoder is
pulled to map everything onto sample 0's embedding, and the true positive pairs are pushed
apart as negatives. The embeddings collapse toward one direction.

Asserts: the mean cosine similarity between unrelated samples rises by more than 0.3
(collapse toward one direction).

Source: https://github.com/sthalles/SimCLR/issues/29 ("all the entries of labels are all
zeros"; correct there only because positives are put in column 0) and
https://github.com/orpatashnik/BalaGAN/issues/3 (NT_xent_loss: the label is zero?).
"""
import torch
import torch.nn.functional as F
from torch import nn


def nt_xent(z1, z2, tau=0.5):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.t() / tau
    sim.fill_diagonal_(float("-inf"))
    labels = torch.zeros(z.shape[0], dtype=torch.long)  # BUG: should be (i + N) % 2N
    return F.cross_entropy(sim, labels)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.no_grad():
        z = F.normalize(model(torch.randn(64, 32)), dim=1)
        start = (z @ z.t()).masked_select(~torch.eye(64, dtype=torch.bool)).mean().item()
    for step in range(30):
        x = torch.randn(32, 32)
        v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
        optimizer.zero_grad()
        loss = nt_xent(model(v1), model(v2))
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        z = F.normalize(model(torch.randn(64, 32)), dim=1)
        off = (z @ z.t()).masked_select(~torch.eye(64, dtype=torch.bool)).mean().item()
    print(f"mean cosine similarity between unrelated samples {start:.3f} -> {off:.3f}")
    assert off > start + 0.3, (start, off)


if __name__ == "__main__":
    main()

"""Healthy: ``ReduceLROnPlateau(mode="max", patience=0, threshold=0.02)`` stepped with the
validation accuracy, which does plateau, so the learning rate is cut.

Looks like: a learning rate that halves several times during training while
the optimizer keeps stepping; an accuracy fed to a scheduler. In "max" mode the cuts happen
only once the accuracy stopped rising, which is what the scheduler is for.

Asserts: the lr is cut at least once, only when the accuracy rose by less than the 2%
threshold, and the accuracy ends above chance.

Mirrors: b07 (mode "min" on an accuracy). Source: the PyTorch docs of ReduceLROnPlateau
(https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.ReduceLROnPlateau.html).
"""
import itertools

import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5,
                                                           patience=0,
                                                           threshold=0.02)
    x, xv = torch.randn(1280, 20), torch.randn(256, 20)
    y, yv = x[:, :5].argmax(1), xv[:, :5].argmax(1)
    best, lrs = 0.0, [0.05]
    for step in range(48):
        idx = torch.arange(step * 32, step * 32 + 32) % 1280
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 4 == 3:
            with torch.no_grad():
                acc = (model(xv).argmax(1) == yv).float().mean().item()
            scheduler.step(acc)
            lr = optimizer.param_groups[0]["lr"]
            if lr < lrs[-1]:
                assert acc <= best * 1.02, (acc, best)  # no 2% improvement
            best = max(best, acc)
            lrs.append(lr)
            print(f"step {step:2d} val acc {acc:.3f} lr {lr:.4f}")
    assert best > 0.5
    cuts = sum(b < a for a, b in itertools.pairwise(lrs))
    print(f"lr cuts: {cuts}")
    assert cuts >= 1


if __name__ == "__main__":
    main()

"""Bug: a hand-written label-smoothing loss puts ``smoothing`` on the true class, not
``1 - smoothing``.

``LabelSmoothingLoss(classes=10, smoothing=0.1)`` builds its target distribution with
``confidence = smoothing`` (the names swapped): the true class gets 0.1 and each of the nine
others 0.9 / 9 = 0.1, a uniform target. The loss is minimised by predicting the uniform
distribution whatever the input: it falls quickly to ln 10 = 2.303 and the accuracy stays at
chance. The network and its gradients are healthy; the criterion is wrong.

Asserts: the smoothed target is uniform; the final loss is within 0.01 of ln 10 and accuracy
stays below 0.3.

Source: https://github.com/TimDettmers/ConvE/issues/55 (label smoothing mass on the wrong term)
and https://github.com/eladhoffer/utils.pytorch/issues/13 (smoothing formula).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class LabelSmoothingLoss(nn.Module):
    def __init__(self, classes, smoothing=0.1):
        super().__init__()
        self.classes = classes
        self.confidence = smoothing  # BUG: should be 1.0 - smoothing
        self.smoothing = 1.0 - smoothing

    def forward(self, logits, target):
        with torch.no_grad():
            dist = torch.full_like(logits, self.smoothing / (self.classes - 1))
            dist.scatter_(1, target[:, None], self.confidence)
        return torch.sum(-dist * F.log_softmax(logits, dim=-1), dim=-1).mean()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    criterion = LabelSmoothingLoss(10, 0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.randn(1280, 20)
    y = x[:, :10].argmax(1)
    for step in range(40):
        idx = torch.arange(step * 32, step * 32 + 32) % 1280
        optimizer.zero_grad()
        logits = model(x[idx])
        loss = criterion(logits, y[idx])
        loss.backward()
        optimizer.step()
        acc = (logits.argmax(1) == y[idx]).float().mean().item()
        print(f"step {step:2d} loss {loss.item():.4f} acc {acc:.2f}")
    assert abs(loss.item() - math.log(10)) < 0.01, loss.item()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    assert acc < 0.3, acc
    print("the smoothed target is uniform: the model learns to predict nothing")


if __name__ == "__main__":
    main()

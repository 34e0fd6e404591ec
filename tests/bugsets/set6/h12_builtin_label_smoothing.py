"""Healthy: ``nn.CrossEntropyLoss(label_smoothing=0.1)`` on a separable problem.

Looks like: a loss that plateaus well above zero (~0.5 with 10 classes) while the accuracy is
perfect, and logits whose gaps stop growing: label smoothing puts 0.01 of the target mass on
each wrong class, so the minimum of the loss is the entropy of the smoothed target, not 0.

Asserts: accuracy above 0.9 and the loss above 0.4 at the end.

Mirrors: b06 (a smoothing loss written by hand, wrong). Source:
https://github.com/pytorch/pytorch/issues/7455 (label smoothing for CrossEntropyLoss), now its
``label_smoothing`` argument.
"""
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    centers = torch.randn(10, 20) * 3
    y = torch.arange(1280) % 10
    x = centers[y] + 0.5 * torch.randn(1280, 20)
    for step in range(40):
        idx = torch.arange(step * 32, step * 32 + 32) % 1280
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"accuracy {acc:.3f}")
    assert acc > 0.9 and loss.item() > 0.4


if __name__ == "__main__":
    main()

"""Bug: missing values in the data: a few rows of a tabular feature are NaN.

The features come from a CSV where an empty cell parsed as NaN (``float("nan")``) and nothing
imputes it. Batches 0-5 happen to hold no such row; batch 6 does: the first Linear's output is
NaN for that sample, the loss is NaN, every gradient is NaN, Adam writes NaN into every weight
and the model is dead from then on (every later output NaN).

Asserts: the loss is finite before step 6, NaN at step 6 and after, and the weights are NaN
at the end.

Source: https://www.baeldung.com/cs/ml-training-nan-errors-fix (NaN from errors and missing values
in the input data, section 3.1).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(480, 8)
    y = x[:, :2].sum(1, keepdim=True)
    x[6 * 32 + 5, 3] = float("nan")  # an empty CSV cell
    x[9 * 32 + 1, 3] = float("nan")
    losses = []
    for step in range(12):
        idx = torch.arange(step * 32, step * 32 + 32)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert all(math.isfinite(v) for v in losses[:6])
    assert all(math.isnan(v) for v in losses[6:])
    assert torch.isnan(model[0].weight).all()
    print("a NaN feature in batch 6 turned every weight into NaN")


if __name__ == "__main__":
    main()

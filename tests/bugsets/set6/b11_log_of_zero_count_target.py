"""Bug: a count target log-transformed with ``torch.log(y)`` where counts can be 0.

Counts are regressed in log space; the target is ``torch.log(counts)`` instead of
``torch.log1p(counts)``. Every batch holds a few zero counts, so the target holds ``-inf``: the
``MSELoss`` criterion's output is ``inf`` from step 0, its gradient w.r.t. the predictions is
``-inf``/NaN and the first ``optimizer.step()`` fills the model with NaN.

Asserts: the target has -inf, the loss is inf at step 0 and not finite afterwards, and the
weights are NaN at the end.

Source: https://dnmtechs.com/understanding-nan-loss-in-deep-learning-with-python-3 (logarithm of
zero as a cause of NaN loss) and https://www.baeldung.com/cs/ml-training-nan-errors-fix.
"""
import math

import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(320, 6)
    counts = torch.poisson(torch.exp(0.5 * x[:, :1]))
    target = torch.log(counts)  # BUG: log1p
    assert torch.isinf(target).any()
    losses = []
    for step in range(10):
        idx = torch.arange(step * 32, step * 32 + 32)
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), target[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step} loss {loss.item()}")
    assert math.isinf(losses[0])
    assert not any(math.isfinite(v) for v in losses)
    assert torch.isnan(model[0].weight).all()
    print("log(0) = -inf in the target: inf loss, NaN weights")


if __name__ == "__main__":
    main()

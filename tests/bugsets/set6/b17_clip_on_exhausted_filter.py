"""Bug: ``clip_grad_norm_`` given a ``filter`` object that the optimizer already consumed.

``params = filter(lambda p: p.requires_grad, model.parameters())`` is passed to the optimizer
and later, every step, to ``clip_grad_norm_(params, 1.0)``. A ``filter`` is a one-shot
iterator: the optimizer's constructor exhausted it, so clipping sees no tensor at all, returns
a total norm of 0 and clips nothing. The run relied on clipping: with targets of scale ~50 and
SGD at lr 0.05 the unclipped updates diverge and the loss overflows to inf, then NaN.

Asserts: clip_grad_norm_ returned 0 at every step while the true gradient norm was large, and
the loss ended non-finite.

Source: https://github.com/PixArt-alpha/PixArt-alpha/pull/160 (params_to_clip built with filter():
clip_grad_norm_ always got an empty list, no clipping) and
https://github.com/pytorch/pytorch/issues/148259 (warn when clip_grad_norm_ receives an exhausted
generator).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    params = filter(lambda p: p.requires_grad, model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05)
    x = torch.randn(640, 10)
    y = 50 * x[:, :1] + 20
    losses = []
    for step in range(15):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        true_norm = sum(p.grad.norm() ** 2 for p in model.parameters()).sqrt()
        clipped = nn.utils.clip_grad_norm_(params, 1.0)  # BUG: params is exhausted
        assert clipped.item() == 0.0 and not true_norm < 1.0
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4g} clip saw {clipped.item()}")
    assert not math.isfinite(losses[-1]), losses
    print("clip_grad_norm_ clipped nothing: the filter was already consumed")


if __name__ == "__main__":
    main()

"""Bug: gradient accumulation with ``optimizer.step()`` on every micro-batch and ``zero_grad()``
only every 4.

The accumulation window was meant to take one step per 4 micro-batches. The ``step()`` sits
outside the ``if (i + 1) % ACCUM == 0`` block while ``zero_grad()`` is inside it, so each step
applies the running sum of the window so far: micro-batch 0's gradient is applied 4 times,
micro-batch 1's 3 times, ... Each update is up to 4x too large and stale, with SGD+momentum
the loss oscillates and ends higher than with a correct window.

Asserts: 4 steps per window happened (the optimizer's step count), the gradient norm at the
4th micro-batch of a window is larger than that of one micro-batch.

Source: https://github.com/lucidrains/reformer-pytorch/issues/97 (optimizer.step() called at
every step, not every gradient_accumulate steps) and
https://github.com/thunlp/OpenPrompt/issues/106 (optimizer step outside the accumulation
condition).
"""
import torch
import torch.nn.functional as F
from torch import nn

ACCUM = 4


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(1024, 16)
    y = (x[:, :4].sum(1, keepdim=True)).sin()
    steps, norms = 0, []
    optimizer.zero_grad()
    for i in range(32):
        idx = torch.arange(i * 16, i * 16 + 16) % 1024
        loss = F.mse_loss(model(x[idx]), y[idx]) / ACCUM
        loss.backward()
        norms.append(sum(p.grad.norm() ** 2 for p in model.parameters()).sqrt().item())
        optimizer.step()  # BUG: belongs inside the if below
        steps += 1
        if (i + 1) % ACCUM == 0:
            optimizer.zero_grad()
        print(f"micro-batch {i:2d} loss {loss.item() * ACCUM:.4f} |grad| {norms[-1]:.4f}")
    assert steps == 32
    assert norms[3] > norms[0] * 1.5, norms[:4]
    print("a step per micro-batch over gradients summed since the window began")


if __name__ == "__main__":
    main()

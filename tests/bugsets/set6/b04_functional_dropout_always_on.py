"""Bug: ``F.dropout(h, 0.5, training=True)`` in forward: dropout stays on under ``model.eval()``.

The block applies functional dropout with ``training=True`` hard-coded (``nn.Dropout`` or
``training=self.training`` follows ``model.eval()``; the functional form does not). Training is
unaffected, but every validation pass under ``model.eval()`` and ``torch.no_grad()`` drops half
of the hidden units at random: two evaluations of the same batch disagree, and the validation
loss is noisy and worse than it should be.

Asserts: two eval-mode forwards of the same batch give different outputs.

Source: https://github.com/pytorch/pytorch/issues/26338 (Behavior of F.dropout in eval mode) and
https://github.com/Coderx7/SimpleNet/issues/2 (functional dropout with training=True).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.dropout(F.relu(self.fc(x)), 0.5, training=True)  # BUG: always on


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(10, 32)
        self.block = Block()
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.block(F.relu(self.stem(x))))


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.randn(512, 10)
    y = x[:, :4].argmax(1)
    xv, yv = torch.randn(64, 10), None
    yv = xv[:, :4].argmax(1)
    for step in range(20):
        model.train()
        idx = torch.arange(step * 32, step * 32 + 32) % 512
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                a, b = model(xv), model(xv)
                val = F.cross_entropy(a, yv).item()
            print(f"step {step:2d} loss {loss.item():.4f} val {val:.4f}")
            assert not torch.allclose(a, b)
    print("eval-mode outputs differ between two passes: dropout is still on")


if __name__ == "__main__":
    main()

"""Healthy: functional dropout written ``F.dropout(h, 0.5, training=self.training)``, validated
under ``model.eval()``, and ``model.train()`` restored before the next step.

Looks like: a forward whose output is random at training time and a model switched between
modes inside the loop; the same batch evaluated twice. In eval mode the dropout is the
identity and both evaluations agree exactly.

Asserts: two eval-mode forwards of the same batch are identical; two train-mode forwards
differ; the loss falls.

Mirrors: b04. Source: https://github.com/rixwew/pytorch-fm/issues/21 (F.dropout needs
training=self.training).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.dropout(F.relu(self.fc(x)), 0.5, training=self.training)


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
    xv = torch.randn(64, 10)
    losses = []
    for step in range(20):
        model.train()
        idx = torch.arange(step * 32, step * 32 + 32) % 512
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                a, b = model(xv), model(xv)
            assert torch.equal(a, b)
        print(f"step {step:2d} loss {loss.item():.4f}")
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(xv), model(xv))
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()

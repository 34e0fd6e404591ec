"""Healthy: AdamW with two param groups: matrices with weight decay 0.1, biases and LayerNorm
parameters with weight decay 0.

Looks like: parameters of the same Linear in two different groups with different
hyper-parameters, a group with ``weight_decay=0``, and 1-D parameters treated apart. This is
the usual Transformer recipe (nanoGPT's configure_optimizers); every parameter is in exactly
one group and all of them train.

Asserts: the groups partition the parameters, every parameter changed, and the loss falls.

Mirrors: b02 (the no-decay group left out). Source:
https://github.com/karpathy/nanoGPT/blob/master/model.py (configure_optimizers).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 48)
        self.norm = nn.LayerNorm(48)
        self.hidden = nn.Linear(48, 48)
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(F.gelu(self.hidden(self.norm(F.gelu(self.inp(x))))))


def main():
    torch.manual_seed(0)
    model = Net()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(640, 12)
    y = (x[:, :3] + 0.5).argmax(1)
    losses = []
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()

"""Bug: ``model.backbone.requires_grad = False`` meant to freeze the backbone: it sets a plain
attribute on the module and freezes nothing.

Fine-tuning a pretrained backbone with a new head, the script writes the Module attribute
instead of ``model.backbone.requires_grad_(False)`` or a loop over its parameters. Python lets
any attribute be set on a Module, so there is no error; the backbone's parameters still require
grad, get gradients, and ``Adam(model.parameters())`` updates them at the head's high learning
rate, destroying the "pretrained" features.

Asserts: the attribute is False, the backbone's parameters still require grad, get a gradient,
and changed.

Source: https://github.com/facebookresearch/fairseq/issues/4702 (parameters still updated
although requires_grad was set to False) and https://github.com/catalyst-team/catalyst/pull/81
(freeze fixed by looping over the module's parameters).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    torch.manual_seed(0)
    model = Net()
    model.backbone.requires_grad = False  # BUG: a plain attribute, freezes nothing
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.backbone.parameters()]
    x = torch.randn(640, 16)
    y = x[:, :3].argmax(1)
    for step in range(20):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        assert model.backbone[0].weight.grad is not None
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert model.backbone.requires_grad is False
    assert all(p.requires_grad for p in model.backbone.parameters())
    after = model.backbone.parameters()
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    print("the 'frozen' backbone was trained")


if __name__ == "__main__":
    main()

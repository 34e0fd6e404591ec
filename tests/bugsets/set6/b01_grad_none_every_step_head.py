"""Bug: a "freeze the last layer for the first epochs" switch that never turns off.

DINO-style training cancels the gradient of the projection head's last layer during the first
epoch(s) by setting its ``.grad = None`` just before ``optimizer.step()``. Here the number of
frozen epochs is read from a config whose default is meant in epochs but compared with the
step counter the other way round (``if step < freeze_last_layer * 1000``), so the head's last
layer has its gradient removed before *every* step of this run: it gets a gradient from each
backward pass (nothing is None or zero during backward) and is never updated, while the
other layers train to fit a random linear read-out.

Asserts: head.last_layer has a non-zero gradient after each backward, is bit-identical at the
end, and the backbone moved.

Source: DINO's ``cancel_gradients_last_layer`` and ``--freeze_last_layer`` (epochs)
(https://github.com/facebookresearch/dino/blob/main/main_dino.py) and
https://github.com/lightly-ai/lightly/issues/1586 (what freeze_last_layer counts and which head
it freezes; fixed in https://github.com/lightly-ai/lightly/pull/1596).
"""
import torch
import torch.nn.functional as F
from torch import nn

FREEZE_LAST_LAYER = 1  # "epochs", but compared with steps below


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.GELU())
        self.last_layer = nn.Linear(32, 4)

    def forward(self, x):
        return self.last_layer(self.mlp(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = Head()

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randn(512, 16)
    y = (x[:, :4] * torch.tensor([1.0, -2.0, 1.5, 0.5])).argmax(1)
    last_before = [p.detach().clone() for p in model.head.last_layer.parameters()]
    backbone_before = model.backbone[0].weight.detach().clone()
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % 512
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        assert model.head.last_layer.weight.grad.abs().max() > 0
        if step < FREEZE_LAST_LAYER * 1000:  # BUG: epochs compared with steps
            for p in model.head.last_layer.parameters():
                p.grad = None
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    last_after = model.head.last_layer.parameters()
    assert all(torch.equal(a, b) for a, b in zip(last_before, last_after, strict=True))
    assert not torch.equal(backbone_before, model.backbone[0].weight)
    print("head.last_layer never stepped: its .grad was set to None before every step")


if __name__ == "__main__":
    main()

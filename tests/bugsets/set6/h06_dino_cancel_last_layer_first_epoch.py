"""Healthy: the projection head's last layer frozen for the first epoch by setting its
``.grad = None`` before ``optimizer.step()``, as DINO's ``cancel_gradients_last_layer`` does.

Looks like: a layer that gets a gradient from every backward pass and is not updated by the
next step (steps 0-9), in an optimizer that holds it. After the first "epoch" of 10 steps the
cancellation stops and the layer trains. DINO does this to stabilise the start of training.

Asserts: head.last_layer is unchanged after step 9 and has changed by the end; the loss falls.

Mirrors: b01 (the same switch that never turns off). Source:
https://github.com/facebookresearch/dino/blob/main/utils.py (cancel_gradients_last_layer) and
https://github.com/facebookresearch/dino/blob/main/main_dino.py (freeze_last_layer, 1 epoch).
"""
import torch
import torch.nn.functional as F
from torch import nn

STEPS_PER_EPOCH, FREEZE_LAST_LAYER = 10, 1


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


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for p in model.head.last_layer.parameters():
        p.grad = None


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randn(512, 16)
    y = (x[:, :4] * torch.tensor([1.0, -2.0, 1.5, 0.5])).argmax(1)
    start = model.head.last_layer.weight.detach().clone()
    losses = []
    for step in range(30):
        epoch = step // STEPS_PER_EPOCH
        idx = torch.arange(step * 32, step * 32 + 32) % 512
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        cancel_gradients_last_layer(epoch, model, FREEZE_LAST_LAYER)
        optimizer.step()
        losses.append(loss.item())
        if step == STEPS_PER_EPOCH - 1:
            assert torch.equal(start, model.head.last_layer.weight)
        print(f"step {step:2d} epoch {epoch} loss {loss.item():.4f}")
    assert not torch.equal(start, model.head.last_layer.weight)
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()

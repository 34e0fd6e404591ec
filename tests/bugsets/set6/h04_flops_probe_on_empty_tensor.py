"""Healthy: a FLOPs/shape probe forward on ``torch.empty(...)`` under no_grad before training.

Looks like: a forward whose input is uninitialised memory (``torch.empty`` may hold NaN, Inf or
huge values; here it is filled with NaN so that every run is the same), so every output of the
probe is NaN, a forward that no backward follows, and a batch of one. The probe only counts
multiply-adds with forward hooks and reads shapes; its values are discarded, and the hooks are
removed before training, which then runs normally.

Asserts: the probe counted the expected multiply-adds, and training lowers the loss.

Mirrors: b10, b11 (non-finite values). Source:
https://github.com/facebookresearch/fvcore/blob/main/docs/flop_count.md (FLOP counting by
tracing a forward on a dummy input) and https://github.com/Lyken17/pytorch-OpCounter (thop:
``profile(model, inputs=(torch.randn(...),))``).
"""
import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def count_macs(model, shape):
    macs = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            macs.append(output.numel() * module.in_channels * module.kernel_size[0] ** 2)
        elif isinstance(module, nn.Linear):
            macs.append(module.in_features * module.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    probe = torch.empty(shape)  # values irrelevant: only shapes are read
    probe.fill_(float("nan"))  # what uninitialised memory may hold; made so in every run
    with torch.no_grad():
        model(probe)
    for h in handles:
        h.remove()
    return sum(macs)


def main():
    torch.manual_seed(0)
    model = SmallCNN()
    macs = count_macs(model, (1, 3, 32, 32))
    print(f"{macs} multiply-adds per image")
    assert macs == 32 * 32 * 8 * 27 + 16 * 16 * 16 * 72 + 1024 * 10
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(160, 3, 32, 32)
    y = (x[:, 0].mean((1, 2)) > 0).long()
    losses = []
    for step in range(15):
        idx = torch.arange(step * 16, step * 16 + 16) % 160
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert sum(losses[-3:]) < sum(losses[:3])


if __name__ == "__main__":
    main()

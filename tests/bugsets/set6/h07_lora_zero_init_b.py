"""Healthy: LoRA adapters on a frozen two-layer network, ``B`` initialised to zero.

Looks like: a frozen base whose weights never get a gradient, adapter ``A`` matrices whose
gradient is exactly zero at step 0 (the gradient of A is B^T times something, and B = 0), and
adapter outputs that are exactly zero at step 0, so the adapted model equals the base model at
first. This is LoRA's published initialisation: B becomes non-zero after the first update, and
A gets a gradient from step 1 on.

Asserts: A's gradient is zero at step 0 and non-zero from step 1; the base is unchanged; the
loss falls.

Mirrors: b18 (what is frozen, what trains). Source:
https://github.com/microsoft/LoRA/blob/main/loralib/layers.py (nn.init.zeros_(self.lora_B)).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base, r=4, alpha=8):
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = LoRALinear(nn.Linear(16, 64))
        self.fc2 = LoRALinear(nn.Linear(64, 3))

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    torch.manual_seed(0)
    model = Net()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-3)
    base = model.fc1.base.weight.detach().clone()
    x = torch.randn(640, 16)
    y = x[:, :3].argmax(1)
    losses = []
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        a_grad = model.fc1.lora_A.grad.abs().max().item()
        assert (a_grad == 0) == (step == 0), (step, a_grad)
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f} |grad A| {a_grad:.2e}")
    assert torch.equal(base, model.fc1.base.weight)
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()

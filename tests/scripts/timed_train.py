"""A real torchvision resnet18 whose ``layer2.1.conv1`` is made slow on purpose (it sleeps a
whole forward's time in its own forward: many times its own time), trained 3 steps; each step's
forward, timed around the model's call, is written to the JSON file named by the first argument
(tests/tracer/test_timing.py). ``transformer`` as the second argument: a small transformer
encoder classifier instead, none of its modules slowed."""

from __future__ import annotations

import json
import sys
import time

import torch
import torchvision
from torch import nn


class Slow(nn.Conv2d):
    pause = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.pause)
        return super().forward(x)


def transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(64, nhead=4, dim_feedforward=128, batch_first=True)
    return nn.Sequential(nn.Linear(16, 64), nn.TransformerEncoder(layer, 2), nn.Flatten(),
                         nn.Linear(64 * 12, 10))


def main(out: str, kind: str) -> None:
    torch.manual_seed(0)
    slow = Slow(128, 128, 3, padding=1, bias=False)
    if kind == "transformer":
        model = transformer()
        x, y = torch.randn(4, 12, 16), torch.randint(0, 10, (4,))
    else:
        model = torchvision.models.resnet18(num_classes=10)
        model.layer2[1].conv1 = slow
        x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    with torch.no_grad():  # untraced (no_grad calls are traced too, but not in a recorded step)
        began = time.perf_counter()
        model(x)
    slow.pause = time.perf_counter() - began  # far more than any other call's own time
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    forwards = []
    for _ in range(3):
        began = time.perf_counter_ns()
        loss = nn.functional.cross_entropy(model(x), y)
        forwards.append((time.perf_counter_ns() - began) / 1000)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with open(out, "w") as f:
        json.dump({"forward_us": forwards, "pause_us": slow.pause * 1e6}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "resnet18")

"""fp16 autocast on CPU with dynamic loss scaling. torch.amp.GradScaler starts with a scale
so large that the first steps' gradients overflow to Inf: it skips those steps' updates and
halves the scale until the gradients are finite. With --no-scaler the same scaled loss is
backpropagated and its Inf gradients applied: the weights turn Inf/NaN for good."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-scaler", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    x, y = torch.randn(16, 32) * 100, torch.randint(0, 10, (16,))
    for step in range(16):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        if args.no_scaler:
            (loss * 2.0**24).backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        print(f"step {step}: loss {loss.item():.4f} scale {scaler.get_scale():g}")


if __name__ == "__main__":
    main()

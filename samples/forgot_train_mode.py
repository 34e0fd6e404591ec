"""Defect sample: a validation pass leaves the model in eval mode for the rest of training.

After each epoch the script validates with ``model.eval()`` and ``torch.no_grad()``, and never
calls ``model.train()`` again: from the second epoch on, dropout is off and BatchNorm normalises
with (and stops updating) its running statistics. Training goes on, a little differently, and
nothing fails.

    hooktrace run -o forgot_train_mode.jsonl samples/forgot_train_mode.py
    hooktrace check forgot_train_mode.jsonl     # eval-backward: model, from step 3 on
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def evaluate(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        x, y = torch.randn(32, 20), torch.randint(0, 3, (32,))
        return F.cross_entropy(model(x), y).item()
    # the bug: no model.train() before training goes on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    for epoch in range(args.epochs):
        for _ in range(args.steps_per_epoch):
            x, y = torch.randn(16, 20), torch.randint(0, 3, (16,))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
            step += 1
        print(f"epoch {epoch}: validation loss {evaluate(model):.4f}")


if __name__ == "__main__":
    main()

"""Defect sample: "my loss goes down in the first run, then never again": the optimizer steps a
copy of the model the loop no longer trains.

The script builds the model and its optimizer, then loads a checkpoint by building the model
anew (``model = Net()`` + ``load_state_dict``) and trains that one. The optimizer still holds
the first model's parameters: ``optimizer.step()`` runs without error, the new model gets
gradients, and its weights never change.

    hooktrace run -o stale_optimizer.jsonl samples/stale_optimizer.py
    hooktrace check stale_optimizer.jsonl     # not-optimized: model 'model', every module
"""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    model = Net()  # the bug: "resuming" builds a new model after the optimizer was built
    model.load_state_dict(checkpoint)
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    for step in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")  # the same loss every step


if __name__ == "__main__":
    main()

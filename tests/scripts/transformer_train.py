"""A small healthy transformer classifier, trained for 4 steps, with what real ones do that a
gradient-flow checker can mistake for defects:

- ``nn.MultiheadAttention`` never calls its ``out_proj``: it uses that Linear's weight itself;
- the head is zero-initialised (as torchvision's ViT does), so at step 0 no gradient reaches
  any layer before it, and from step 1 on every layer gets one;
- a block's shortcut is an empty ``nn.Sequential`` placeholder, never called.

``--unused`` adds a Linear that really is never used (its parameters get no gradient).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=64,
                                               batch_first=True)
        self.shortcut = nn.Sequential()  # a placeholder: this block needs no projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


class Classifier(nn.Module):
    def __init__(self, width: int, classes: int, unused: bool) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        if unused:
            self.aux = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unused", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Classifier(16, 4, args.unused).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 6, 8), torch.randint(0, 4, (8,))
    for step in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""A healthy training loop for ``hooktrace check``: torchvision resnet18 (random weights),
STEPS (argv[1], default 2) SGD steps on random 64x64 images, batch 2, cross-entropy loss."""

import sys

import torch
import torch.nn.functional as F
import torchvision


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for step in range(steps):
        images = torch.randn(2, 3, 64, 64)
        labels = torch.randint(0, 10, (2,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

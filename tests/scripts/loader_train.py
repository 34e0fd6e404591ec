"""Training with DataLoader workers whose dataset calls an nn.Module (a transform) per item:
the workers run the tracer's hooks too, and must never write into the log."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.transform = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        with torch.no_grad():
            return self.transform(torch.randn(8))


def main() -> None:
    context = sys.argv[1] if len(sys.argv) > 1 else "fork"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))
    loader = DataLoader(Noisy(), batch_size=8, num_workers=2, multiprocessing_context=context)
    for batch in loader:
        model(batch).sum().backward()
    print("done")


if __name__ == "__main__":
    main()

"""The four training steps of issue 6 (W1..W4), built with fixed seeds.

Each workload is one *training step*: ``zero_grad``, forward, loss, backward, SGD step, on the
same fixed batch every time. The loss is functional (``F.mse_loss`` / ``F.cross_entropy``), not
a module, so the module events per step are exactly those of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Schedule:
    """How many interleaved rounds to run; each variant's session in a round runs ``warmup``
    untimed steps, then ``block`` timed ones."""

    rounds: int
    quick_rounds: int
    block: int
    warmup: int = 1


@dataclass
class Workload:
    name: str
    description: str
    model: nn.Module
    step: Callable[[], None]
    schedule: Schedule


def _training_step(model: nn.Module, batch: torch.Tensor,
                   loss: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(model(batch)).backward()
        optimizer.step()

    return step


def _mlp(device: torch.device) -> tuple[nn.Module, torch.Tensor, Callable[..., torch.Tensor]]:
    layers: list[nn.Module] = []
    for _ in range(200):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    target = torch.randn(32, 64, device=device)
    return (nn.Sequential(*layers), torch.randn(32, 64, device=device),
            lambda out: F.mse_loss(out, target))


def _resnet(arch: str, batch: int, size: int, device: torch.device
            ) -> tuple[nn.Module, torch.Tensor, Callable[..., torch.Tensor]]:
    import torchvision  # only W2/W4 need it

    model = getattr(torchvision.models, arch)(weights=None)
    target = torch.randint(0, 1000, (batch,), device=device)
    return (model, torch.randn(batch, 3, size, size, device=device),
            lambda out: F.cross_entropy(out, target))


def _transformer(device: torch.device
                 ) -> tuple[nn.Module, torch.Tensor, Callable[..., torch.Tensor]]:
    layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    return model, torch.randn(8, 64, 128, device=device), lambda out: out.pow(2).mean()


_SPECS = {
    # name: (description, builder, schedule); W1 is cheap per step, so it gets many rounds
    "W1": ("200 x (Linear(64,64)+ReLU), batch 32", _mlp, Schedule(150, 20, block=2)),
    "W2": ("torchvision resnet18, batch 8 at 64x64",
           lambda d: _resnet("resnet18", 8, 64, d), Schedule(40, 4, block=2)),
    "W3": ("TransformerEncoder, 4 layers, d_model 128, 4 heads, seq 64, batch 8",
           _transformer, Schedule(40, 4, block=2)),
    "W4": ("torchvision resnet50, batch 2 at 224x224",
           lambda d: _resnet("resnet50", 2, 224, d), Schedule(30, 2, block=1)),
}

NAMES = tuple(_SPECS)


def build(name: str, device: torch.device) -> Workload:
    """Build workload ``name`` from seed 0, so every run measures the same weights and batch."""
    description, builder, schedule = _SPECS[name]
    torch.manual_seed(0)
    model, batch, loss = builder(device)
    model.to(device).train()
    return Workload(name, description, model, _training_step(model, batch, loss), schedule)

"""Gradient-flow bugs from the PyTorch forums, one per CASE (argv[1]), and healthy look-alikes.

    python flow_bugs.py CASE [STEPS]

Each case trains a small model for STEPS (default 3) steps on random data with SGD. The bug
cases break the gradient in one known module; the ``ok_`` cases look like a bug and are not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torchvision.ops import StochasticDepth


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Detached(nn.Module):
    """``.detach()`` on the encoder's features in the model's own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(x).detach()  # the bug: left over from a feature-extraction run
        return self.head(features)


class NumpyBlock(nn.Module):
    """A block that takes its input through numpy: a new tensor, with no history."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        clipped = torch.from_numpy(np.clip(x.detach().numpy(), -1, 1))  # the bug
        return self.fc(clipped)


class NumpyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.block = NumpyBlock()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.encoder(x)))


class NoGradProj(nn.Module):
    """A projection computed under ``torch.no_grad()`` inside forward (meant for a target)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # the bug: meant for the target branch only
            z = self.proj(self.encoder(x))
        return self.head(z)


def mlp(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), *layers)


class ZeroGrad(torch.autograd.Function):
    """A custom straight-through op whose backward returns zeros (the bug)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.round()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad)  # should be `grad` (straight-through)


class Quantize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ZeroGrad.apply(x)


class MaskedBranch(nn.Module):
    """An auxiliary branch whose weight in the sum is a 0 (a loss weight left at 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 16)
        self.main = nn.Linear(16, 4)
        self.aux = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        self.aux_weight = 0.0  # the bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        return self.main(h) + self.aux_weight * self.aux(h)


class SharedEncoder(nn.Module):
    """A siamese model whose second call of the shared encoder is detached (the bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.encoder = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.encoder(self.embed(x))
        b = self.encoder(self.embed(x.flip(0))).detach()
        return self.head(torch.cat([a, b], dim=1))


class InplaceGate(nn.Module):
    """A gate that doubles its sigmoid's output in place: sigmoid's backward needs it (the bug:
    backward raises "modified by an inplace operation")."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.fc(x))
        y.mul_(2.0)
        return y


def reloaded_eval() -> nn.Module:
    """Healthy: train a transformer layer, then evaluate a fresh copy loaded from its state
    (as pytorch/examples' word_language_model does): the copy never runs backward, and its
    MultiheadAttention never calls its out_proj."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer, nn.Flatten(), nn.Linear(8 * 4, 4))
    train(model, 2, inputs=(8, 4, 8))
    best = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                         nn.Flatten(), nn.Linear(8 * 4, 4))
    best.load_state_dict(model.state_dict())
    best.eval()
    with torch.no_grad():
        best(torch.randn(8, 4, 8))
    return best


def dead_relu() -> nn.Module:
    model = mlp(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[3].bias.fill_(-100.0)  # the bug: every pre-activation of model[4] is negative
    return model


def saturated_sigmoid() -> nn.Module:
    model = mlp(nn.Linear(16, 16), nn.Sigmoid(), nn.Linear(16, 4))
    with torch.no_grad():
        model[3].weight.abs_()  # the bug: all-positive weights and a large bias
        model[3].bias.fill_(15.0)  # saturate the sigmoid after them
    return model


def zero_head() -> nn.Module:
    model = mlp(nn.ReLU(), nn.Linear(16, 4))
    nn.init.zeros_(model[-1].weight)  # as torchvision's ViT does: recovers after one step
    nn.init.zeros_(model[-1].bias)
    return model


def zero_head_frozen() -> nn.Module:
    model = zero_head()
    model[-1].requires_grad_(False)  # the bug: the zero head is frozen, it never recovers
    return model


def layer_scale() -> nn.Module:
    """Healthy: residual blocks whose branch is scaled by 1e-6 (ConvNeXt's layer scale)."""

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gamma = nn.Parameter(torch.full((16,), 1e-6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gamma

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.scale = Scale()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.scale(torch.relu(self.fc(x)))

    return nn.Sequential(nn.Linear(8, 16), Block(), Block(), nn.Linear(16, 4))


class DropBlock(nn.Module):
    """Healthy: a residual block with stochastic depth (torchvision's), dropping the branch for
    the whole batch now and then."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.drop = StochasticDepth(0.2, "batch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.branch(x))  # type: ignore[no-any-return]


class PooledHead(nn.Module):
    """Healthy: EfficientNet's head, an in-place Dropout on a flattened view."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).view(8, 4, 4).flatten(1))  # type: ignore[no-any-return]


class LevelHeads(nn.Module):
    """Healthy: detection heads shared across three feature levels (torchvision's RPN); the box
    loss reads only the levels with a matching anchor, and the last level has none (small
    images): that call of ``box`` gets an exactly-zero gradient, its other calls do not."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.levels = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.cls = nn.Linear(16, 4)
        self.box = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        features = [torch.relu(level(h)) for level in self.levels]
        logits = torch.stack([self.cls(f) for f in features]).sum(0)
        boxes = torch.stack([self.box(f) for f in features])
        matched = torch.tensor([True, True, False])
        return logits + boxes[matched].sum(0)


class PerLevelBoxes(nn.Module):
    """A box head per feature level (SSD's), their outputs concatenated; ``zero_level``: the
    bug, that level's output multiplied by 0 inside the forward."""

    def __init__(self, zero_level: int | None = None) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(16, 4) for _ in range(3))
        self.zero_level = zero_level

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        outs = [head(f) for head, f in zip(self.heads, features, strict=True)]
        if self.zero_level is not None:
            outs[self.zero_level] = outs[self.zero_level] * 0
        return torch.cat(outs)


class LevelSelection(nn.Module):
    """A detector whose loss reads the boxes of the matched rows only. ``read``: "matched",
    healthy, rows of the first two levels chosen by the data, the last level never (small
    boxes: SSD's coarse levels); "all", every row, with the last level multiplied by 0 inside
    the box head (the bug); "none", a mask that is always empty (the bug)."""

    def __init__(self, read: str = "matched") -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.levels = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.cls = nn.Linear(16, 4)
        self.boxes = PerLevelBoxes(2 if read == "all" else None)
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        features = [torch.relu(level(h)) for level in self.levels]
        logits = torch.stack([self.cls(f) for f in features]).sum(0)
        boxes = self.boxes(features)  # 3 levels x 8 rows
        matched = torch.zeros(len(boxes), dtype=torch.bool)
        if self.read == "matched":
            matched[:16] = (x[:, 0] > 0).repeat(2)  # the data decides; the last level never
        elif self.read == "all":
            matched[:] = True
        return logits + boxes[matched].sum(0)


CASES: dict[str, Callable[[], nn.Module]] = {
    "detached": Detached,
    "numpy_block": NumpyModel,
    "no_grad_proj": NoGradProj,
    "dead_relu": dead_relu,
    "saturated_sigmoid": saturated_sigmoid,
    "zero_head": zero_head,
    "zero_head_frozen": zero_head_frozen,
    "zero_grad_function": lambda: mlp(Quantize(), nn.Linear(16, 4)),
    "masked_branch": MaskedBranch,
    "shared_detached": SharedEncoder,
    "zeroed_level": lambda: LevelSelection("all"),
    "empty_mask": lambda: LevelSelection("none"),
    "backward_inplace": lambda: mlp(InplaceGate(), nn.Linear(16, 4)),
    "ok_layer_scale": layer_scale,
    "ok_frozen_backbone": lambda: mlp(nn.ReLU(), nn.Linear(16, 4)),
    "ok_stochastic_depth": lambda: nn.Sequential(nn.Linear(8, 16), *(DropBlock() for _ in range(4)),
                                                 nn.Linear(16, 4)),
    "ok_inplace_dropout_view": PooledHead,
    "ok_level_heads": LevelHeads,
    "ok_level_selection": LevelSelection,
}


def train(model: nn.Module, steps: int, frozen_backbone: bool = False,
          inputs: tuple[int, ...] = (8, 8)) -> None:
    if frozen_backbone:
        for layer in list(model)[:3]:
            layer.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(*inputs), torch.randint(0, 4, (8,))
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


def main() -> None:
    case = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.manual_seed(0)
    if case == "ok_reloaded_eval":
        reloaded_eval()
        return
    model = CASES[case]()
    train(model, steps, frozen_backbone=case == "ok_frozen_backbone")
    print(f"{case}: trained {steps} steps")


if __name__ == "__main__":
    main()

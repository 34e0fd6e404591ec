"""Field programs for what the log says ran (issue 47, items 1 to 3): one per CASE (argv[1]),
each training a tiny seeded model on CPU for a few steps.

- ``decorated``: a ``forward`` decorated with ``@torch.autocast`` (the decorator's code is in
  torch) whose branch is ``.detach()``ed: check's ``source:`` must name this file's ``def``.
- ``plain``: the same model with an undecorated ``forward`` (its look-alike).
- ``replaced``, ``replaced_identity``: the activation of an ``nn.Sequential`` replaced after two
  steps (``model[1] = nn.Sigmoid()``, ``nn.Identity()``), two steps more.
- ``replaced_gelu``, ``replaced_relu``: replaced by a GELU, or by a new ReLU (the same class: no
  new module); ``kept``: never replaced. ``diff`` of the first with the others must differ.
- ``shared_act``: ultralytics' ``Conv.default_act``, one ``nn.SiLU`` instance in every Conv of
  every model: a probe model run once, then the trained model. Each model's calls are its own.
- ``shared_act_one_model``: the trained model alone: its shared activation keeps its names.
- ``unused_view``: an ``nn.Flatten`` of the features, a whole view of them, read for a metric
  only: no gradient reaches it (its base, the features, gets one through the head).
- ``position_bias``: swin V2's continuous position bias (``Linear`` -> ``ReLU(inplace=True)``
  -> ``Linear`` on a buffer of coordinates) called several times a step: by a block applied
  twice, and once more for a metric under ``no_grad``: each call the loss reads gets a
  gradient (the in-place ReLU rebuilt its first Linear's node).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
STEPS = 4


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = STEPS,
        after: int | None = None, replace: nn.Module | None = None) -> None:
    """SGD on cross entropy; ``model[1] = replace`` after ``after`` steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == after and replace is not None:
            model[1] = replace  # type: ignore[index]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class Branches(nn.Module):
    """Two branches summed, the second ``.detach()``ed: no gradient reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.branch_a = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.branch_b = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch_a(x) + self.branch_b(x).detach()


class Decorated(Branches):
    @torch.autocast("cpu", enabled=False)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch_a(x) + self.branch_b(x).detach()


class Conv(nn.Module):
    """ultralytics' Conv: its activation is one module shared by every instance of the class."""

    default_act = nn.SiLU()

    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, 3, padding=1)
        self.act = self.default_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))  # type: ignore[no-any-return]


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(Conv(3, 4), Conv(4, 4))
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x).mean((2, 3)))  # type: ignore[no-any-return]


class Features(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.flatten = nn.Flatten(0)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.body(x)
        self.spread = float(self.flatten(feats).std())  # a metric: the loss never reads it
        return self.head(feats)  # type: ignore[no-any-return]


class PositionBias(nn.Module):
    """swin V2's ``cpb_mlp`` on its ``relative_coords_table``: the first Linear's output is a
    whole view (its input is 4-d), changed in place by the ReLU."""

    def __init__(self, heads: int = 2) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(1, 5, 5, 2))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 16), nn.ReLU(inplace=True),
                                     nn.Linear(16, heads, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = 16 * torch.sigmoid(self.cpb_mlp(self.table).view(-1, x.shape[-1]))
        return x + bias.mean(0)


class Recurrent(nn.Module):
    """One block applied twice a step, its bias computed once more for a metric."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 2)
        self.block = PositionBias()
        self.head = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(self.block(self.embed(x)))
        with torch.no_grad():  # a metric
            self.bias_max = float(self.block.cpb_mlp(self.block.table).max())
        return self.head(h)  # type: ignore[no-any-return]


REPLACEMENTS = {"replaced": nn.Sigmoid, "replaced_identity": nn.Identity,
                "replaced_gelu": nn.GELU, "replaced_relu": nn.ReLU}


def main(case: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    if case in ("decorated", "plain"):
        fit(Decorated() if case == "decorated" else Branches(), x, y)
    elif case in REPLACEMENTS or case == "kept":
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        replace = REPLACEMENTS[case]() if case in REPLACEMENTS else None
        fit(model, x, y, after=2, replace=replace)
    elif case == "unused_view":
        fit(Features(), x, y, steps=2)
    elif case == "position_bias":
        fit(Recurrent(), x, y, steps=2)
    elif case in ("shared_act", "shared_act_one_model"):
        images = torch.randn(4, 3, 8, 8)
        if case == "shared_act":
            probe = Detector()  # a model run once to check something (ultralytics' AMP check)
            with torch.no_grad():
                probe(images)
        model = Detector()
        fit(model, images, y[:4], steps=2)
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main(sys.argv[1])

"""What the optimizer holds versus what the model is: bugs (each a CASE, argv[1]) and the healthy
look-alikes (``ok_*``) that must stay silent. Each trains a tiny seeded model on CPU for a few
steps."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrizations, parametrize
from torch.optim.swa_utils import AveragedModel

torch.set_num_threads(1)
STEPS = 3


def data(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8), torch.randint(0, 3, (n,))


def fit(model: nn.Module, opt: torch.optim.Optimizer, steps: int = STEPS,
        after: Callable[[], None] | None = None) -> None:
    x, y = data()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if after is not None:
            after()


class DictHeads(nn.Module):
    """Two heads kept in a plain dict: neither is registered, each must keep its own name."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.heads = {"a": nn.Linear(16, 3), "b": nn.Linear(16, 3)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        return self.heads["a"](h) + self.heads["b"](h)


def dict_heads() -> None:
    torch.manual_seed(0)
    model = DictHeads()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


class NestedList(nn.Module):
    """Stages as a list of lists: found in no plain attribute of their caller."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.stages = [[nn.Linear(16, 16)], [nn.Linear(16, 16)]]
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for stage in self.stages:
            for layer in stage:
                h = torch.relu(layer(h))
        return self.head(h)


def nested_list() -> None:
    torch.manual_seed(0)
    model = NestedList()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


class TwoScales(nn.Module):
    """Two Parameters made from one tensor: one storage, two optimizer entries."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)
        start = torch.ones(3)
        self.scale_a = nn.Parameter(start)
        self.scale_b = nn.Parameter(start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale_a + self.scale_b


def params_from_one_tensor() -> None:
    torch.manual_seed(0)
    model = TwoScales()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


def stepped_three_times() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, opt, after=lambda: (opt.step(), opt.step()))


# ------------------------------------------------------------------ healthy look-alikes


class Lists(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 3), "b": nn.Linear(8, 3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.heads["a"](x) + self.heads["b"](x)


def ok_module_list_dict() -> None:
    torch.manual_seed(0)
    model = Lists()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


class WithAux(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 3).requires_grad_(False)  # kept for later, frozen, never run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def ok_frozen_unused() -> None:
    """A frozen aux head that never runs, on the model and on its DataParallel wrapper."""
    torch.manual_seed(0)
    model = nn.DataParallel(WithAux())
    model.probe = nn.Linear(8, 3).requires_grad_(False)  # a frozen tool kept on the wrapper
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_dataparallel() -> None:
    """The head replaced inside the wrapped model, the optimizer over the wrapper's parameters."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    model = nn.DataParallel(net)
    model.module[2] = nn.Linear(16, 3)
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_parametrize_unsafe() -> None:
    """register_parametrization after the optimizer, one tensor in, one out (unsafe=True): the
    original is the same Parameter the optimizer holds."""

    class Symmetric(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w.triu() + w.triu(1).transpose(0, 1)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    parametrize.register_parametrization(model[0], "weight", Symmetric(), unsafe=True)
    fit(model, opt)


def ok_orthogonal_after_opt() -> None:
    """parametrizations.orthogonal after the optimizer: its original is the old Parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    parametrizations.orthogonal(model[0])
    fit(model, opt)


class FlatParams(nn.Module):
    """Two Parameters that are views of one flat buffer at different offsets, and a buffer that
    views a Parameter's storage: no two Parameters over one tensor."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.randn(8 * 3 + 3) * 0.1
        self.weight = nn.Parameter(flat[:24].view(3, 8))
        self.bias = nn.Parameter(flat[24:])
        self.register_buffer("weight_view", self.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def ok_views_not_tied() -> None:
    torch.manual_seed(0)
    model = FlatParams()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_swa_ema() -> None:
    """An SWA average and an EMA copy: parameters copied, not shared; an LR-finder-like restart
    (the model's state saved and loaded back, the optimizer built again)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    saved = copy.deepcopy(model.state_dict())
    finder = torch.optim.SGD(model.parameters(), lr=1e-3)
    for lr in (1e-3, 1e-2):
        for group in finder.param_groups:
            group["lr"] = lr
        fit(model, finder, steps=1)
    model.load_state_dict(saved)
    swa, ema = AveragedModel(model), copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def average() -> None:
        swa.update_parameters(model)
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.lerp_(p, 0.1)

    fit(model, opt, after=average)


def ok_accum_flush() -> None:
    """Accumulation over 2 backwards, gradients zeroed in place, and a flush step() at the end
    of each epoch (for a last partial cycle; here there is none) that finds them zeroed: not
    the same gradients again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(32)
    for _ in range(3):
        for i, (xb, yb) in enumerate(zip(x.chunk(4), y.chunk(4), strict=True)):
            (F.cross_entropy(model(xb), yb) / 2).backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad(set_to_none=False)
        opt.step()  # the flush for a last partial cycle
        opt.zero_grad(set_to_none=False)


def ok_lbfgs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x, y = data()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(STEPS):
        opt.step(closure)


BUGS: tuple[Callable[[], None], ...] = (
    dict_heads, nested_list, params_from_one_tensor, stepped_three_times)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_module_list_dict, ok_frozen_unused, ok_dataparallel, ok_parametrize_unsafe,
    ok_orthogonal_after_opt, ok_views_not_tied, ok_swa_ema, ok_accum_flush, ok_lbfgs)
CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (*BUGS, *HEALTHY)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print(f"{sys.argv[1]}: done")

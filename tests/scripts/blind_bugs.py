"""Gradient-flow bugs written blind (without reading the other bug scripts), each modelled on a
forum question, one per CASE (argv[1]), and healthy look-alikes (``ok_*``) that must stay silent.
Each trains a tiny model on CPU for a few steps, seeded."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 4


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
          optimizer: torch.optim.Optimizer | None = None, lr: float = 0.1,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
          steps: int = STEPS) -> None:
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.4f}")


def batch(n: int = 16, features: int = 8, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, features), torch.randint(0, classes, (n,))


# "my encoder does not learn": the batch of features rebuilt row by row with torch.tensor
class Rebuilt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = mlp(8, 16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        h = torch.tensor([row.tolist() for row in h])
        return self.head(h)


def tensor_rewrap() -> None:
    train(Rebuilt(), *batch())


# "I froze layer 0 of the encoder but the decoder trains worse": the name match is too broad
class Stack(nn.Module):
    def __init__(self, *sizes: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))


class EncDec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Stack(8, 16, 16)
        self.decoder = Stack(16, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in [*self.encoder.layers, *self.decoder.layers]:
            x = torch.relu(layer(x)) if layer.out_features != 3 else layer(x)
        return x


def freeze_too_broad() -> None:
    model = EncDec()
    for name, p in model.named_parameters():
        if "layers.0" in name:  # meant: encoder.layers.0 only
            p.requires_grad = False
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    train(model, *batch(), optimizer=optimizer)


# "only the last layer's weights change": the optimizer gets the head's parameters only
class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = mlp(8, 32, 32)
        self.fc = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.backbone(x)))


def optimizer_head_only() -> None:
    model = Classifier()
    train(model, *batch(), optimizer=torch.optim.SGD(model.fc.parameters(), lr=0.1))


# "element 0 does not require grad, so I set loss.requires_grad = True; now nothing trains"
def argmax_loss() -> None:
    model = Classifier()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        optimizer.zero_grad()
        pred = model(x).argmax(dim=1).float()
        loss = F.mse_loss(pred, y.float())
        loss.requires_grad = True
        loss.backward()
        optimizer.step()


# "my weight-normalised layer's weight never changes": .data in forward
class NormedLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.data / self.weight.data.norm(dim=1, keepdim=True)
        return F.linear(x, w, self.bias)


def data_in_forward() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), NormedLinear(16, 16), nn.ReLU(),
                          nn.Linear(16, 3))
    train(model, *batch())


# "loss is inf / nan from the first batch": log of a softmax that underflows to 0
class ProbHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 3)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(self.softmax(self.fc(x)))


def log_softmax_inf() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), ProbHead())
    x, y = batch()
    train(model, x * 200, y, loss_fn=F.nll_loss)


# "NaN from the first step": per-batch standardisation of a feature that is constant
class Standardize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=0)) / x.std(dim=0)


def std_zero() -> None:
    x, y = batch()
    x[:, 3] = 1.0  # a feature that is the same in every sample
    model = nn.Sequential(Standardize(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    train(model, x, y)


# "my learnable scale does not change": nn.Parameter created in forward each call
class ScaledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scale = nn.Parameter(torch.ones(16))
        return self.fc(x) * self.scale


def param_in_forward() -> None:
    model = nn.Sequential(ScaledBlock(), nn.ReLU(), nn.Linear(16, 3))
    train(model, *batch())


# "the gated branch never learns": the gate's bias starts far too negative (sigmoid saturated)
class GatedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value = nn.Linear(16, 16)
        self.gate = nn.Linear(16, 16)
        self.sigmoid = nn.Sigmoid()
        nn.init.constant_(self.gate.bias, -40.0)  # "start with the gate closed"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.sigmoid(self.gate(x)) * self.value(x)


def saturated_gate() -> None:
    model = nn.Sequential(nn.Linear(8, 16), GatedBlock(), nn.Linear(16, 3))
    train(model, *batch())


# "NaN after a few iterations with .half()": raw 0-255 pixels, fp16, no loss scaler
def fp16_overflow() -> None:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10)).half()
    x = torch.randint(0, 256, (16, 64)).half()
    y = torch.randint(0, 10, (16,))
    train(model, x, y, lr=0.05, steps=6)


# "weights do not update": gradient clipping with max_norm=0 ("0 means off")
def clip_zero() -> None:
    model = Classifier()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clip = 0.0
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        optimizer.step()


# "the second block never trains": forward returns the wrong variable
class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = mlp(8, 16, 16)
        self.block2 = mlp(16, 16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.block1(x))
        h2 = torch.relu(self.block2(h))  # noqa: F841 -- the bug: head gets h, not h2
        return self.head(h)


def wrong_return() -> None:
    train(TwoBlocks(), *batch())


class SafeSqrt(nn.Module):
    """torch.where to 'guard' a sqrt of negatives (the bug): the forward is finite, but the
    branch where does not pick still gets a gradient, 0 * inf = NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x))


def where_sqrt() -> None:
    train(nn.Sequential(nn.Linear(8, 16), SafeSqrt(), nn.Linear(16, 3)), *batch())


# healthy: gradient accumulation, zero_grad every 2 steps
def ok_grad_accum() -> None:
    model = Classifier()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        loss = F.cross_entropy(model(x[step % 2::2]), y[step % 2::2]) / 2
        loss.backward()
        if step % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()


# healthy: BatchNorm running statistics frozen (BN in eval), everything else trains
def ok_frozen_bn_stats() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    model.train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.eval()
    train(model, *batch())


# healthy: a residual whose shortcut is detached; the body still carries the gradient back
class DetachedSkip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.body = mlp(16, 16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(self.body(h) + h.detach())


def ok_detach_skip() -> None:
    train(DetachedSkip(), *batch())


# healthy: a multi-task model whose auxiliary loss has a small weight (1e-3)
class MultiTask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = mlp(8, 16, 16)
        self.main = nn.Linear(16, 3)
        self.aux = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return self.main(h), self.aux(h)


def ok_aux_small_weight() -> None:
    model = MultiTask()
    x, y = batch()
    target = x.sum(dim=1, keepdim=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        optimizer.zero_grad()
        logits, value = model(x)
        loss = F.cross_entropy(logits, y) + 1e-3 * F.mse_loss(value, target)
        loss.backward()
        optimizer.step()


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in [
    tensor_rewrap, freeze_too_broad, optimizer_head_only, argmax_loss, data_in_forward,
    log_softmax_inf, std_zero, param_in_forward, saturated_gate, fp16_overflow, clip_zero,
    wrong_return, where_sqrt, ok_grad_accum, ok_frozen_bn_stats, ok_detach_skip,
    ok_aux_small_weight]}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()

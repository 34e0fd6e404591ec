"""Healthy recipes that look like bugs to a hook: a forward under no_grad recomputed in the
backward (reversible layers), linear probing in eval mode, data transforms that are modules.
Each next to the bug it resembles, which ``check`` still names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from helpers import events
from torch import nn
from torchvision.transforms import v2

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.show.steplog import load_step


class _Reversible(torch.autograd.Function):
    """y1 = x1 + f(x2), y2 = x2 + g(y1): the forward keeps no activations (under no_grad);
    the backward rebuilds the inputs from the outputs and runs f and g again, with gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, f: nn.Module, g: nn.Module) -> torch.Tensor:
        ctx.f, ctx.g = f, g
        x1, x2 = x.chunk(2, dim=-1)
        with torch.no_grad():
            y1 = x1 + f(x2)
            y = torch.cat([y1, x2 + g(y1)], dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (y,) = ctx.saved_tensors
        y1, y2 = y.chunk(2, dim=-1)
        dy1, dy2 = dy.chunk(2, dim=-1)
        with torch.enable_grad():
            y1 = y1.detach().requires_grad_()
            gy1 = ctx.g(y1)
            torch.autograd.backward(gy1, dy2)
        assert y1.grad is not None
        dx1 = dy1 + y1.grad
        with torch.enable_grad():
            x2 = (y2 - gy1).detach().requires_grad_()
            torch.autograd.backward(ctx.f(x2), dx1)
        assert x2.grad is not None
        return torch.cat([dx1, dy2 + x2.grad], dim=-1), None, None


class RevBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU())
        self.g = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Reversible.apply(x, self.f, self.g)  # type: ignore[no-any-return]


def test_reversible_layers_recomputed_in_backward_are_not_no_grad(log_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), RevBlock(8), RevBlock(8), nn.Linear(16, 3))
    with hooktrace.trace(log_path, model=model, steps="0:2"):
        for _ in range(2):
            F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
    assert model[1].f[1].weight.grad is not None and model[1].f[1].weight.grad.abs().sum() > 0
    # the log has the recomputed calls, with their backward
    assert any(e.recompute and e.fqn == "1.f.1" for e in events(log_path, "backward"))
    assert run_checks(log_path).findings == []


def test_a_block_left_under_no_grad_is_still_named(log_path: Path) -> None:
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # the bug: meant to train
                x = self.body(x)
            return self.head(x)

    model = Frozen()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(4, 8)).sum().backward()
    [found] = run_checks(log_path).problems
    assert (found.cause, found.module) == ("no-grad-under-no_grad", "")  # the forward with it
    assert "torch.no_grad() covers body" in found.message


def _probe(model: nn.Module, head: nn.Module, path: Path, train_mode: bool = False) -> None:
    model.train(train_mode)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    with hooktrace.trace(path, model=model, steps="0:2"):
        for _ in range(2):
            F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1])).backward()
            optimizer.step()
            optimizer.zero_grad()


def _frozen(arch: str) -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None)
    return model.requires_grad_(False)


def test_linear_probing_in_eval_mode_is_not_a_problem(log_path: Path) -> None:
    model = _frozen("resnet18")
    model.fc = nn.Linear(512, 2)  # trainable; the frozen BatchNorms keep their statistics
    _probe(model, model.fc, log_path)
    report = run_checks(log_path)
    assert [f.cause for f in report.problems] == []
    # the frozen backbone is said once, by its subtrees, not once a layer (41 notes before,
    # then one a subtree: 6)
    [frozen] = [f for f in report.findings if f.cause == "frozen"]
    assert frozen.module == "conv1"
    assert frozen.evidence["roles"]["backbone"] == ["conv1", "bn1", "layer1", "layer2",
                                                    "layer3", "layer4"]
    assert "a frozen backbone (conv1, bn1, layer1, layer2, layer3, layer4)" in frozen.message


def test_linear_probing_with_a_dropout_head_is_a_note(log_path: Path) -> None:
    model = _frozen("mobilenet_v3_small")
    model.classifier[3] = nn.Linear(1024, 2)  # behind classifier.2, a Dropout(0.2)
    _probe(model, model.classifier[3], log_path)
    found = [f for f in run_checks(log_path).findings if f.cause == "eval-backward"]
    assert [(f.severity, f.module) for f in found] == [("note", "")]
    assert "its dropout is off in what trains" in found[0].message
    assert "classifier.2" in found[0].message


def test_training_on_in_eval_mode_is_still_named(log_path: Path) -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=2)  # everything trains, BatchNorms too
    _probe(model, model, log_path)
    [found] = [f for f in run_checks(log_path).problems if f.cause == "eval-backward"]
    assert found.severity == "warning"
    assert "bn1" in found.message


def _prepare(n: int) -> torch.Tensor:
    crop, flip = v2.RandomResizedCrop(16, antialias=True), v2.RandomHorizontalFlip()
    return torch.stack([flip(crop(torch.rand(3, 24, 24))) for _ in range(n)])


def test_data_transforms_are_not_models(log_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14, 2))
    with hooktrace.trace(log_path, steps="0:2"):  # every module the script calls
        for _ in range(2):
            F.cross_entropy(model(_prepare(2)), torch.tensor([0, 1])).backward()
    step = load_step(log_path)
    # in the log, the transforms are models of their own, called once a sample
    assert {"RandomResizedCrop", "RandomHorizontalFlip"} <= set(step.classes.values())
    # not in the picture, not in the findings (it said their gradients add up, before)
    assert {step.models[e.model] for e in step.events} == {"model"}
    assert run_checks(log_path).findings == []


def _amp_steps(path: Path, scaled: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")  # its default scale: 65536
    with hooktrace.trace(path, model=model, steps="0:3"):
        for _ in range(3):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            if scaled:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:  # the same size of gradients, never unscaled: they are that large
                (loss * 65536).backward()
                optimizer.step()


def test_gradients_a_loss_scaler_scales_are_not_exploding(log_path: Path) -> None:
    _amp_steps(log_path, scaled=True)
    assert run_checks(log_path).problems == []


def test_gradients_as_large_without_a_scaler_are_exploding(log_path: Path) -> None:
    _amp_steps(log_path, scaled=False)
    assert [f.cause for f in run_checks(log_path).problems] == ["exploding"]

"""The step, explained (issue 36, item 1): in-process traces of small training loops whose
optimizer step breaks an expectation (a param group left at lr 0, an optimizer built anew each
step, ``zero_grad`` per micro-batch, a negative clipping factor, a per-epoch schedule stepped
per batch) get one ``step-unexplained`` (or ``lr-collapsed``) finding saying which; the healthy
look-alikes of each (a warmup from lr 0, a staggered warmup, one rebuild at an unfreeze, plain
SGD rebuilt, two optimizers in turns, SAM's two passes, an analysis pass before the real one,
PCGrad's per-task passes, micro-batches summed by hand, a gradient reversal layer,
ExponentialLR(0.9) and a short cosine per batch) write none."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import Finding

from . import steploop
from .steploop import loss, mlp

Loop = Callable[[], None]
STEPS = 4


def steps(model: nn.Module, opt: torch.optim.Optimizer, n: int = STEPS, **hooks: Any) -> None:
    steploop.steps(model, opt, n, **hooks)


# --- bugs --------------------------------------------------------------------------------------

def group_at_zero() -> None:
    model = mlp()
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": weights}, {"params": biases}], lr=0.0)
    opt.param_groups[1]["lr"] = 1e-2
    steps(model, opt)


def rebuilt_adam() -> None:
    model = mlp()
    for _ in range(4):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        steps(model, opt, n=1)


def rebuilt_momentum_sgd() -> None:
    model = mlp()
    for _ in range(4):
        steps(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), n=1)


def zero_grad_per_microbatch() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for _ in range(4):
            opt.zero_grad()
            (loss(model) / 4).backward()
        opt.step()


def negative_clip() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps(model, opt, between=lambda: nn.utils.clip_grad_norm_(model.parameters(), -1.0))


def negated_by_hand() -> None:
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def negate() -> None:
        for p in model.parameters():
            assert p.grad is not None
            p.grad.mul_(-0.5)
    steps(model, opt, between=negate)


def exponential_per_batch() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.1)
    steps(model, opt, n=7, after=sched.step)


# (the loop, the expectation it breaks: a step-unexplained finding's, or "lr-collapsed")
BUGS: dict[str, tuple[Loop, str]] = {
    "group_at_zero": (group_at_zero, "group-lr"),
    "rebuilt_adam": (rebuilt_adam, "state"),
    "rebuilt_momentum_sgd": (rebuilt_momentum_sgd, "state"),
    "zero_grad_per_microbatch": (zero_grad_per_microbatch, "cleared"),
    "negative_clip": (negative_clip, "sign"),
    "negated_by_hand": (negated_by_hand, "sign"),
    "exponential_per_batch": (exponential_per_batch, "lr-collapsed"),
}


# --- healthy look-alikes -----------------------------------------------------------------------

def warmup_from_zero() -> None:
    """HF's get_linear_schedule_with_warmup: every group at lr 0 at the first step."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 3))
    steps(model, opt, n=6, after=sched.step)


def staggered_warmup() -> None:
    """The head trains from the start, the backbone's group joins after one step at lr 0."""
    model = mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                           {"params": model[2].parameters()}], lr=0.1)

    def join() -> None:
        opt.param_groups[0]["lr"] = 0.01
    steps(model, opt, after=join)


def rebuilt_once_at_unfreeze() -> None:
    model = mlp()
    steps(model, torch.optim.Adam(model[2].parameters(), lr=1e-2), n=3)
    steps(model, torch.optim.Adam(model.parameters(), lr=1e-3), n=3)


def plain_sgd_rebuilt() -> None:
    """Plain SGD keeps no state: building it anew loses nothing."""
    model = mlp()
    for _ in range(4):
        steps(model, torch.optim.SGD(model.parameters(), lr=0.1), n=1)


def two_optimizers_in_turns() -> None:
    model = mlp()
    first = torch.optim.Adam(model.parameters(), lr=1e-3)
    second = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(3):
        steps(model, first, n=1)
        steps(model, second, n=1)


def sam_two_passes() -> None:
    """SAM: a pass, the weights moved up the gradient, zero_grad, a second pass, the step."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            moves = [0.05 * p.grad for p in model.parameters() if p.grad is not None]
            for p, e in zip(model.parameters(), moves, strict=True):
                p.add_(e)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p, e in zip(model.parameters(), moves, strict=True):
                p.sub_(e)
        opt.step()


def analysis_pass_first() -> None:
    """A pass for a gradient norm (logged), zero_grad, then the pass that trains."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss(model).backward()
        opt.zero_grad()
        loss(model).backward()
        opt.step()


def pcgrad() -> None:
    """PCGrad: a pass per task, each from no gradient, then the combined gradient set."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        per_task = []
        for _ in range(3):
            opt.zero_grad()
            loss(model).backward()
            per_task.append([p.grad.clone() for p in model.parameters()
                             if p.grad is not None])
        for p, *grads in zip(model.parameters(), *per_task, strict=True):
            p.grad = torch.stack(grads).mean(0)
        opt.step()


def accumulated_by_hand() -> None:
    """Each micro-batch from no gradient, summed into buffers copied into .grad at the end."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        sums = [torch.zeros_like(p) for p in model.parameters()]
        for _ in range(4):
            opt.zero_grad()
            loss(model).backward()
            for total, p in zip(sums, model.parameters(), strict=True):
                assert p.grad is not None
                total += p.grad / 4
        for total, p in zip(sums, model.parameters(), strict=True):
            assert p.grad is not None
            p.grad.copy_(total)
        opt.step()


def accumulation() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        for _ in range(4):
            (loss(model) / 4).backward()
        opt.step()


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return -grad


def gradient_reversal() -> None:
    """A gradient reversal layer flips the sign inside backward, not between it and the step."""
    torch.manual_seed(0)
    features, domain = nn.Linear(8, 8), nn.Linear(8, 2)
    opt = torch.optim.SGD([*features.parameters(), *domain.parameters()], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        out = domain(_Reverse.apply(features(torch.randn(8, 8))))
        F.cross_entropy(out, torch.randint(0, 2, (8,))).backward()
        opt.step()


def clip_and_scale() -> None:
    """Clipping for real, after gradients scaled by hand and unscaled (positive factors)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        opt.zero_grad()
        (loss(model) * 1024).backward()
        for p in model.parameters():
            assert p.grad is not None
            p.grad.div_(1024)
        nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()


def exponential_slow() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    steps(model, opt, n=8, after=sched.step)


def short_cosine() -> None:
    """A cosine over the eight steps of the run: ends at 0, never by one factor."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)
    steps(model, opt, n=8, after=sched.step)


HEALTHY: dict[str, Loop] = {
    "warmup_from_zero": warmup_from_zero, "staggered_warmup": staggered_warmup,
    "rebuilt_once_at_unfreeze": rebuilt_once_at_unfreeze, "plain_sgd_rebuilt": plain_sgd_rebuilt,
    "two_optimizers_in_turns": two_optimizers_in_turns, "sam_two_passes": sam_two_passes,
    "analysis_pass_first": analysis_pass_first, "accumulation": accumulation,
    "pcgrad": pcgrad, "accumulated_by_hand": accumulated_by_hand,
    "gradient_reversal": gradient_reversal, "clip_and_scale": clip_and_scale,
    "exponential_slow": exponential_slow, "short_cosine": short_cosine,
}


def traced(loop: Loop, path: Path) -> list[Finding]:
    """What check says of ``loop`` traced (the expectations of the step, a collapsed lr); its
    model and optimizer are collected before tracing stops, as a script's are when its
    ``main()`` returns and the collector runs."""
    with hooktrace.trace(path):
        loop()
        gc.collect()
    return [f for f in run_checks(path).findings
            if f.cause in ("step-unexplained", "lr-collapsed")]


def expectations(found: list[Finding]) -> list[str]:
    return [f.cause if f.cause != "step-unexplained" else f.evidence["expectation"]
            for f in found]


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_broken_expectation_is_said(log_path: Path, case: str) -> None:
    loop, expectation = BUGS[case]
    assert expectations(traced(loop, log_path)) == [expectation]


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_healthy_look_alikes_are_silent(log_path: Path, case: str) -> None:
    assert traced(HEALTHY[case], log_path) == []


def test_where_each_expectation_broke(log_path: Path) -> None:
    """What each signal says: the group and its modules, the steps, the factor."""
    (group,) = traced(group_at_zero, log_path)
    assert (group.step, group.module) == (0, "0")
    assert {k: group.evidence[k] for k in ("optimizer", "group", "steps", "others", "modules")} == {
        "optimizer": "AdamW", "group": 0, "steps": [0, 1, 2, 3], "others": 0.01,
        "modules": ["0", "2"]}
    (state,) = traced(rebuilt_adam, log_path)
    assert (state.step, state.evidence["optimizer"], state.evidence["steps"]) == (1, "Adam",
                                                                              [1, 2, 3])
    (cleared,) = traced(zero_grad_per_microbatch, log_path)
    assert (cleared.step, cleared.evidence["windows"], cleared.evidence["passes"]) == (1, 2, 3)
    (sign,) = traced(negated_by_hand, log_path)
    assert sign.evidence["steps"] == [0, 1, 2, 3]
    assert sign.evidence["factor"] == pytest.approx(-0.5)
    (collapsed,) = traced(exponential_per_batch, log_path)
    assert collapsed.evidence["factor"] == pytest.approx(0.1)


def test_the_findings_say_which_expectation(log_path: Path) -> None:
    for loop, says, hint in (
            (group_at_zero, "param group 0 of the AdamW optimizer of model 'model' (0, 2) "
             "stepped at lr 0 in all 4 steps", "inside the `for param_group in"),
            (rebuilt_adam, "a new Adam optimizer took over the parameters of model "
             "'model' 3 times (steps 1, 2, 3)", "build the optimizer once"),
            (zero_grad_per_microbatch, "were cleared between backward passes of one "
             "accumulation: 3 passes before one optimizer step", "zero_grad() once per "
             "accumulation"),
            (negative_clip, "were multiplied by a negative factor", "negative max_norm"),
            (exponential_per_batch, "multiplied by 0.1 at every optimizer step, fell below "
             "1e-4 of its peak", "stepped once per batch")):
        traced(loop, log_path)
        (found,) = [f for f in run_checks(log_path).findings if f.severity != "note"]
        assert says in found.message
        assert hint in (found.hint or "")

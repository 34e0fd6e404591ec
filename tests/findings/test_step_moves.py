"""The step, explained: the move (issue 36, item 1, expectation ``update``). In-process traces of
small training loops whose optimizer step moves the weights against what its gradient, its
group's lr and its kind say (a custom optimizer with a sign error, a linear decay whose lr goes
below 0, ``maximize=True`` by mistake) get one ``step-unexplained`` finding with
``expectation`` ``update``; the healthy look-alikes (SGD with momentum, nesterov and weight
decay, AdamW, Adam with amsgrad, foreach and fused, a GradScaler that skips a step, a warmup
from lr 0, clipping, LBFGS, SAM, Lookahead, accumulation, groups at different lrs, a scheduler
per step, a custom Adam-like optimizer) write none."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
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
STEPS = 5


def steps(model: nn.Module, opt: torch.optim.Optimizer, n: int = STEPS, **hooks: Any) -> None:
    steploop.steps(model, opt, n, **hooks)


class SignErrorSGD(torch.optim.Optimizer):
    """A hand-written SGD whose update adds the gradient: ``p.add_(grad, alpha=lr)``."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=group["lr"])


class HandAdam(torch.optim.Optimizer):
    """A hand-written Adam without bias correction: healthy, judged by its direction only."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                m = state.setdefault("m", torch.zeros_like(p)).mul_(0.9).add_(p.grad, alpha=0.1)
                v = state.setdefault("v", torch.zeros_like(p)).mul_(0.999).addcmul_(
                    p.grad, p.grad, value=0.001)
                p.addcdiv_(m, v.sqrt().add_(1e-8), value=-group["lr"])


# --- bugs --------------------------------------------------------------------------------------

def custom_sign_error() -> None:
    model = mlp()
    steps(model, SignErrorSGD(model.parameters(), lr=0.05))


def linear_decay_below_zero() -> None:
    """``LambdaLR(lambda s: 1 - s / total)`` with ``total`` shorter than the run: lr < 0."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / 2)
    steps(model, opt, n=7, after=sched.step)


def maximize_by_mistake() -> None:
    model = mlp()
    steps(model, torch.optim.Adam(model.parameters(), lr=1e-3, maximize=True))


# (the loop, its verdict, its cause)
BUGS: dict[str, tuple[Loop, str, str]] = {
    "custom_sign_error": (custom_sign_error, "reversed", "custom"),
    "linear_decay_below_zero": (linear_decay_below_zero, "reversed", "lr"),
    "maximize_by_mistake": (maximize_by_mistake, "reversed", "maximize"),
}


# --- healthy look-alikes -----------------------------------------------------------------------

def sgd(**kwargs: Any) -> Loop:
    def loop() -> None:
        model = mlp()
        steps(model, torch.optim.SGD(model.parameters(), lr=0.1, **kwargs))
    return loop


def adam(cls: type[torch.optim.Optimizer], **kwargs: Any) -> Loop:
    def loop() -> None:
        model = mlp()
        steps(model, cls(model.parameters(), lr=1e-2, **kwargs))
    return loop


def bf16_weights() -> None:
    """bfloat16 weights: many moves round away, the others show."""
    model = mlp().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    for _ in range(5):
        opt.zero_grad()
        out = model(torch.randn(8, 8, dtype=torch.bfloat16)).float()
        F.cross_entropy(out, torch.randint(0, 4, (8,))).backward()
        opt.step()


def grad_scaler_skips() -> None:
    """A GradScaler on the CPU whose first steps find inf gradients and skip the step."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    scales = []
    for _ in range(6):
        opt.zero_grad()
        scaler.scale(loss(model) * 4).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales[0] < 2.0 ** 127 and scales[-1] == scales[-2]  # skipped, then stepped


def warmup_and_scheduler() -> None:
    """A warmup from lr 0 then a cosine, stepped per batch, over groups at different lrs,
    with clipping."""
    model = mlp()
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-3},
                             {"params": model[2].parameters(), "lr": 1e-2}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2))
    steps(model, opt, n=6, after=sched.step,
          between=lambda: nn.utils.clip_grad_norm_(model.parameters(), 0.1))


def accumulation() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        for _ in range(3):
            (loss(model) / 3).backward()
        opt.step()


def lbfgs() -> None:
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        out = F.cross_entropy(model(x), y)
        out.backward()
        return out
    for _ in range(3):
        opt.step(closure)


class SAM(torch.optim.Optimizer):
    """davda54/sam: a step up the gradient, a second pass, back, the base optimizer's step."""

    def __init__(self, params: Iterable[torch.Tensor], rho: float = 0.05, **kwargs: Any) -> None:
        super().__init__(params, {"rho": rho, **kwargs})
        self.base = torch.optim.SGD(self.param_groups, momentum=0.9, **kwargs)
        self.param_groups = self.base.param_groups

    @torch.no_grad()
    def first_step(self) -> None:
        grads = [p.grad for group in self.param_groups for p in group["params"]
                 if p.grad is not None]
        norm = torch.norm(torch.stack([g.norm() for g in grads]))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["old"] = p.data.clone()
                    p.add_(p.grad * group["rho"] / (norm + 1e-12))

    @torch.no_grad()
    def second_step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = self.state[p]["old"]
        self.base.step()


def sam() -> None:
    model = mlp()
    opt = SAM(model.parameters(), lr=0.1)
    for _ in range(4):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.first_step()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.second_step()


class Lookahead(torch.optim.Optimizer):
    """Lookahead: the inner optimizer's step, and every k steps the slow weights pulled in."""

    def __init__(self, base: torch.optim.Optimizer, k: int = 2, alpha: float = 0.5) -> None:
        self.base, self.k, self.alpha, self.count = base, k, alpha, 0
        super().__init__(base.param_groups, {})
        self.param_groups = base.param_groups
        self.slow = [p.detach().clone() for group in base.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.base.step()
        self.count += 1
        if self.count % self.k == 0:
            fast = [p for group in self.param_groups for p in group["params"]]
            for slow, p in zip(self.slow, fast, strict=True):
                slow.add_(p - slow, alpha=self.alpha)
                p.copy_(slow)


def lookahead() -> None:
    model = mlp()
    steps(model, Lookahead(torch.optim.SGD(model.parameters(), lr=0.5)), n=6)


def hand_adam() -> None:
    model = mlp()
    steps(model, HandAdam(model.parameters(), lr=1e-2))


HEALTHY: dict[str, Loop] = {
    "sgd_momentum": sgd(momentum=0.9),
    "sgd_nesterov_decay": sgd(momentum=0.9, nesterov=True, weight_decay=0.1),
    "sgd_dampening_for_loop": sgd(momentum=0.9, dampening=0.5, foreach=False),
    "sgd_strong_decay": sgd(weight_decay=1.0),
    "adamw": adam(torch.optim.AdamW, weight_decay=0.5),
    "adam_amsgrad_l2": adam(torch.optim.Adam, amsgrad=True, weight_decay=0.1),
    "adam_foreach_betas": adam(torch.optim.Adam, foreach=True, betas=(0.5, 0.9)),
    "adamw_fused_amsgrad": adam(torch.optim.AdamW, fused=True, amsgrad=True),
    "bf16_weights": bf16_weights, "grad_scaler_skips": grad_scaler_skips,
    "warmup_and_scheduler": warmup_and_scheduler, "accumulation": accumulation,
    "lbfgs": lbfgs, "sam": sam, "lookahead": lookahead, "hand_adam": hand_adam,
}


def traced(loop: Loop, path: Path) -> list[Finding]:
    """What check says of the moves of ``loop`` traced."""
    with hooktrace.trace(path):
        loop()
        gc.collect()  # the model and optimizer gone before tracing stops, as after a main()
    return [f for f in run_checks(path).findings
            if f.cause == "step-unexplained" and f.evidence["expectation"] == "update"]


@pytest.mark.parametrize("case", sorted(BUGS))
def test_a_move_against_the_step_is_said(log_path: Path, case: str) -> None:
    loop, verdict, cause = BUGS[case]
    (found,) = traced(loop, log_path)
    assert (found.evidence["verdict"], found.evidence["cause"]) == (verdict, cause)
    assert found.evidence["count"] >= 2
    assert found.module == "0"


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_healthy_moves_are_silent(log_path: Path, case: str) -> None:
    assert traced(HEALTHY[case], log_path) == []


def test_the_findings_say_what_the_step_did(log_path: Path) -> None:
    for loop, says, hint in (
            (custom_sign_error, "the SignErrorSGD optimizer of model 'model' (0, 2) moved the "
             "weights along +g", "alpha=-lr"),
            (linear_decay_below_zero, "stepped at a negative learning rate", "max(0.0"),
            (maximize_by_mistake, "maximize=True", "drop maximize=True")):
        traced(loop, log_path)
        (found,) = [f for f in run_checks(log_path).findings
                    if f.cause == "step-unexplained"]
        assert says in found.message
        assert hint in (found.hint or "")


def test_a_scaler_that_skips_steps_is_not_an_accumulation(log_path: Path) -> None:
    """A GradScaler whose first steps find inf gradients calls no optimizer step for them, and
    the next iteration's zero_grad drops their gradients: not a zero_grad per micro-batch
    (``cleared``), with the model still alive when tracing stops."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    with hooktrace.trace(log_path):
        for _ in range(6):
            opt.zero_grad()
            scaler.scale(loss(model) * 4).backward()
            scaler.step(opt)
            scaler.update()
    assert scaler.get_scale() < 2.0 ** 126  # two steps skipped at least
    assert [f for f in run_checks(log_path).findings if f.cause == "step-unexplained"] == []

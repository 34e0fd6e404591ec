"""Losses written as functions and loss scaling, as ``lossgraph`` sees them from the root of
each backward pass: bugs (named) and their healthy look-alikes (``ok_*``, silent). One case per
run (argv[1]); each trains a tiny seeded model on CPU for a few steps."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
STEPS = 3


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def data(n: int = 16, classes: int = 4) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return mlp(8, 32, classes), torch.randn(n, 8), torch.randint(0, classes, (n,))


def fit(loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
        classes: int = 4) -> None:
    model, x, y = data(classes=classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def autocast16() -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.float16)


# ============================================================ bugs


def module_ce_on_functional_softmax() -> None:
    # nn.CrossEntropyLoss fed F.softmax of the model's output: the loss module sees no Softmax
    # module before it, the graph does
    criterion = nn.CrossEntropyLoss()
    fit(lambda m, x, y: criterion(F.softmax(m(x), dim=1), y))


class SegNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.classifier = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.body(x))


def nll_on_conv_scores() -> None:
    # F.nll_loss on a segmentation net's per-pixel scores (NllLoss2d on a Conv2d output)
    torch.manual_seed(0)
    model = SegNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2, 8, 8))
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def bce_logits_on_functional_sigmoid() -> None:
    fit(lambda m, x, y: F.binary_cross_entropy_with_logits(
        torch.sigmoid(m(x)), F.one_hot(y, 4).float()))


def scaled_step_accumulated() -> None:
    # two scaled micro-batches accumulated, then optimizer.step() without the scaler
    model, x, y = data(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(STEPS):
        opt.zero_grad()
        for xb, yb in zip(x.chunk(2), y.chunk(2), strict=True):
            with autocast16():
                loss = F.cross_entropy(model(xb), yb) / 2
            scaler.scale(loss).backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


# ============================================================ healthy look-alikes


def ok_ce_label_smoothing() -> None:
    fit(lambda m, x, y: F.cross_entropy(m(x), y, label_smoothing=0.1))


def ok_log_softmax_nll() -> None:
    fit(lambda m, x, y: F.nll_loss(F.log_softmax(m(x), dim=1), y))


def ok_log_of_softmax_nll() -> None:
    # log of probabilities: log-probabilities (less stable than log_softmax, not wrong)
    fit(lambda m, x, y: F.nll_loss(torch.log(F.softmax(m(x), dim=1) + 1e-8), y))


def ok_model_ends_log_softmax() -> None:
    model, x, y = data()
    net = nn.Sequential(model, nn.LogSoftmax(dim=1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.nll_loss(net(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def ok_bce_on_sigmoid() -> None:
    fit(lambda m, x, y: F.binary_cross_entropy(torch.sigmoid(m(x)), F.one_hot(y, 4).float()))


def ok_bce_logits_on_logits() -> None:
    fit(lambda m, x, y: F.binary_cross_entropy_with_logits(m(x), F.one_hot(y, 4).float()))


def ok_distill_kl() -> None:
    # a student taught by a teacher: KL divergence between log_softmax and softmax
    torch.manual_seed(1)
    teacher = mlp(8, 32, 4)
    t = 2.0

    def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            soft = F.softmax(teacher(x) / t, dim=1)
        out = m(x)
        kd = F.kl_div(F.log_softmax(out / t, dim=1), soft, reduction="batchmean") * t * t
        return kd + F.cross_entropy(out, y)
    fit(loss_fn)


def ok_checkpointed_masked_loss() -> None:
    # the loss computed under non-reentrant checkpointing, a mask multiplied in, then scaled:
    # the mask's saved tensor has an unpack hook, and reading it outside backward would run
    # the loss function again
    model, x, y = data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    calls = []
    mask = (torch.arange(16) % 4 != 0).float()

    def masked(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return (F.cross_entropy(out, y, reduction="none") * mask).sum() / mask.sum()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = checkpoint(masked, model(x), y, use_reentrant=False)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"loss {loss.item():.4f}")
    print(f"loss function ran {len(calls)} times (untraced: {2 * STEPS})")
    assert len(calls) == 2 * STEPS


def amp_loop(step: Callable[[torch.amp.GradScaler, torch.optim.Optimizer, nn.Module], None],
             optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
             enabled: bool = True) -> None:
    model, x, y = data(32)
    opt = optimizer(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=enabled)
    for _ in range(STEPS):
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        step(scaler, opt, model)
        scaler.update()
        print(f"loss {loss.item():.4f} scale {scaler.get_scale():.0f}")


def ok_scaler_step() -> None:
    amp_loop(lambda scaler, opt, model: scaler.step(opt))


def ok_unscale_clip_step() -> None:
    def step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, model: nn.Module) -> None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
    amp_loop(step)


def ok_unscale_then_optimizer_step() -> None:
    # unscale_ then optimizer.step(): the gradients are unscaled (no inf check, still right)
    def step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, model: nn.Module) -> None:
        scaler.unscale_(opt)
        opt.step()
    amp_loop(step)


def ok_fused_adam_scaler() -> None:
    # a fused optimizer unscales inside its step: scaler.step calls optimizer.step() directly
    amp_loop(lambda scaler, opt, model: scaler.step(opt),
             optimizer=lambda params, lr: torch.optim.Adam(params, lr=lr, fused=True))


def ok_scaler_disabled() -> None:
    # GradScaler(enabled=False) (AMP switched off): scale() returns the loss, step is plain
    amp_loop(lambda scaler, opt, model: opt.step(), enabled=False)


def ok_gan_amp_one_scaler() -> None:
    torch.manual_seed(0)
    generator, discriminator = mlp(4, 32, 8), mlp(8, 32, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    real, ones, zeros = torch.randn(16, 8) + 2, torch.ones(16, 1), torch.zeros(16, 1)
    for _ in range(STEPS):
        with autocast16():
            fake = generator(torch.randn(16, 4))
            d_loss = (F.binary_cross_entropy_with_logits(discriminator(real), ones)
                      + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros))
        opt_d.zero_grad()
        scaler.scale(d_loss).backward()
        scaler.step(opt_d)
        with autocast16():
            g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        opt_g.zero_grad()
        scaler.scale(g_loss).backward()
        scaler.step(opt_g)
        scaler.update()
        print(f"d {d_loss.item():.4f} g {g_loss.item():.4f}")


def ok_second_optimizer_unscaled_pass() -> None:
    # model a trains under AMP through the scaler; model b, in float32, on its own loss and
    # optimizer, stepped directly after a pass that was not scaled
    torch.manual_seed(0)
    a, b = mlp(8, 32, 4), mlp(8, 16, 1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y, target = torch.randn(16, 8), torch.randint(0, 4, (16,)), torch.randn(16, 1)
    for _ in range(STEPS):
        opt_a.zero_grad()
        with autocast16():
            loss_a = F.cross_entropy(a(x), y)
        scaler.scale(loss_a).backward()
        scaler.step(opt_a)
        scaler.update()
        opt_b.zero_grad()
        loss_b = F.mse_loss(b(x), target)
        loss_b.backward()
        opt_b.step()
        print(f"a {loss_a.item():.4f} b {loss_b.item():.4f}")


def ok_gradient_penalty_amp() -> None:
    # PyTorch's AMP recipe for a gradient penalty: autograd.grad of the scaled loss, unscaled
    # by hand, its norm added to the loss, which is scaled once
    model, x, y = data(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    params = list(model.parameters())
    for _ in range(STEPS):
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
        inv = 1.0 / scaler.get_scale()
        with autocast16():
            penalty = torch.stack([(g * inv).pow(2).sum() for g in grads]).sum().sqrt()
            total = loss + 0.1 * penalty
        scaler.scale(total).backward()
        scaler.step(opt)
        scaler.update()
        print(f"loss {loss.item():.4f} penalty {penalty.item():.4f}")


BUGS: tuple[Callable[[], None], ...] = (
    module_ce_on_functional_softmax, nll_on_conv_scores, bce_logits_on_functional_sigmoid,
    scaled_step_accumulated,
)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_ce_label_smoothing, ok_log_softmax_nll, ok_log_of_softmax_nll, ok_model_ends_log_softmax,
    ok_bce_on_sigmoid, ok_bce_logits_on_logits, ok_distill_kl, ok_checkpointed_masked_loss,
    ok_scaler_step, ok_unscale_clip_step, ok_unscale_then_optimizer_step, ok_fused_adam_scaler,
    ok_scaler_disabled, ok_gan_amp_one_scaler, ok_second_optimizer_unscaled_pass,
    ok_gradient_penalty_amp,
)
CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (*BUGS, *HEALTHY)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()

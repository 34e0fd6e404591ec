"""More bugs from PyTorch forum questions ("my weights don't change", "loss is NaN", "element 0
of tensors does not require grad"), one per CASE (argv[1]), and healthy look-alikes (``ok_``).

    python forum_bugs.py CASE

Each trains a small model for 3-4 steps on random data; the comment marks the bug.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


class TempScale(nn.Module):
    """A learnable temperature, read as a Python number in forward (the bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.log_t = nn.Parameter(torch.zeros(()))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / float(self.log_t.exp().item())


class PrunedLinear(nn.Linear):
    """A pruning mask applied to the weight in place inside forward (the bug)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, n)
        self.register_buffer("mask", (torch.rand(n, n) > 0.5).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.mul_(self.mask)
        return super().forward(x)


class LM(nn.Module):
    def __init__(self, padding_idx: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, padding_idx=padding_idx)
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.out = nn.Linear(16, 20)

    def forward(self, ids: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, hidden = self.rnn(self.embed(ids), hidden)
        return self.out(h), hidden


class PairDistance(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ((a - b) ** 2).sum(1).sqrt()  # the bug: no eps, and a == b in some pairs


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = mlp(8, 16, 4)
        self.dist = PairDistance()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.dist(self.embed(a), self.embed(b))  # type: ignore[no-any-return]


class Deep(nn.Module):
    """Hidden layers kept in a plain Python list (the bug): not registered submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.hidden = [nn.Linear(16, 16) for _ in range(2)]
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)  # type: ignore[no-any-return]


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for n, m in itertools.pairwise(sizes):
        layers += [nn.Linear(n, m), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 8), torch.randint(0, 4, (8,))


def train(model: nn.Module, steps: int = 4, lr: float = 0.1,
          optimizer: torch.optim.Optimizer | None = None) -> None:
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def item_param() -> None:
    model = nn.Sequential(mlp(8, 16, 4))
    model.add_module("temp", TempScale())
    train(model)


def plain_list() -> None:
    train(Deep())


def model_recreated() -> None:
    model = mlp(8, 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = mlp(8, 16, 4)  # the bug: a fresh model after the optimizer was built
    train(model, optimizer=opt)


def no_grad_backbone() -> None:
    backbone, head = mlp(8, 16, 16), nn.Linear(16, 4)
    opt = torch.optim.SGD([*backbone.parameters(), *head.parameters()], lr=0.1)
    for _ in range(4):
        x, y = data()
        with torch.no_grad():  # the bug: left over from a linear-probe script
            features = backbone(x)
        opt.zero_grad()
        F.cross_entropy(head(features), y).backward()
        opt.step()


def cleared_before_step() -> None:
    model = mlp(8, 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        x, y = data()
        F.cross_entropy(model(x), y).backward()
        opt.zero_grad()  # the bug: between backward() and step()
        opt.step()


def frozen_all() -> None:
    model = mlp(8, 16, 4)
    for p in model.parameters():  # the bug: meant to freeze all but the last layer
        p.requires_grad = False
    train(model)


def inplace_param() -> None:
    train(nn.Sequential(nn.Linear(8, 16), PrunedLinear(16), nn.ReLU(), nn.Linear(16, 4)))


def hidden_carried() -> None:
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hidden = None
    for _ in range(3):
        ids, target = torch.randint(0, 20, (4, 6)), torch.randint(0, 20, (4, 6))
        logits, hidden = model(ids, hidden)  # the bug: hidden is never detached
        opt.zero_grad()
        F.cross_entropy(logits.reshape(-1, 20), target.reshape(-1)).backward()
        opt.step()


def all_padding() -> None:
    model = LM(padding_idx=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        ids = torch.zeros(4, 6, dtype=torch.long)  # the bug: every token mapped to padding
        opt.zero_grad()
        F.cross_entropy(model(ids)[0].reshape(-1, 20), torch.randint(0, 20, (24,))).backward()
        opt.step()


def diverges() -> None:
    train(mlp(8, 32, 32, 4), steps=5, lr=50.0)  # the bug: a learning rate far too large


def nan_gradient_applied() -> None:
    model = Siamese()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        a = torch.randn(8, 8)
        b = torch.cat([a[:4], torch.randn(4, 8)])  # the first 4 pairs are equal
        opt.zero_grad()
        F.mse_loss(model(a, b), torch.ones(8)).backward()
        opt.step()


def ok_gan_rerun() -> None:
    """A GAN step as tutorials write it: the discriminator's step runs G(z).detach(), the
    generator's step runs G again."""
    g, d = mlp(4, 16, 8), mlp(8, 16, 1)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3)
    for _ in range(2):
        for _ in range(2):  # two critic steps per generator step
            opt_d.zero_grad()
            (d(g(torch.randn(8, 4)).detach()).mean() - d(torch.randn(8, 8) + 1).mean()
             ).backward()
            opt_d.step()
        opt_g.zero_grad()
        (-d(g(torch.randn(8, 4))).mean()).backward()
        opt_g.step()


def ok_adversarial() -> None:
    """Adversarial training: the input's gradient from torch.autograd.grad (no parameter
    gradient), then a training step on the perturbed input."""
    model = mlp(8, 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = data()
        x.requires_grad_(True)
        [grad] = torch.autograd.grad(F.cross_entropy(model(x), y), x)
        opt.zero_grad()
        F.cross_entropy(model((x + 0.1 * grad.sign()).detach()), y).backward()
        opt.step()


def ok_gradient_penalty() -> None:
    """WGAN-GP: the critic's gradient at a mix of real and fake samples, with create_graph=True,
    enters its loss; that loss's backward runs back through the gradient's graph, where the
    second derivative of a ReLU is exactly zero for the layer before it."""
    generator, critic = mlp(4, 16, 8), mlp(8, 16, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.5, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
    for _ in range(3):
        real, fake = torch.randn(8, 8), generator(torch.randn(8, 4)).detach()
        eps = torch.rand(8, 1)
        mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
        [grad] = torch.autograd.grad(critic(mix).sum(), mix, create_graph=True)
        penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        opt_c.zero_grad()
        (critic(fake).mean() - critic(real).mean() + 10 * penalty).backward()
        opt_c.step()
        opt_g.zero_grad()
        (-critic(generator(torch.randn(8, 4))).mean()).backward()
        opt_g.step()


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = mlp(8, *[32] * 8)
        self.main = nn.Linear(32, 4)
        self.aux = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return self.main(h), self.aux(h)


def ok_tiny_auxiliary_head() -> None:
    """A deep trunk with a main head and an auxiliary head whose loss weighs 1e-8: the
    auxiliary head's backward runs first and its gradient is tiny, while the trunk's is not."""
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        x, y = data()
        logits, value = model(x)
        opt.zero_grad()
        (F.cross_entropy(logits, y) + 1e-8 * value.pow(2).mean()).backward()
        opt.step()


def ok_loss_modules() -> None:
    """Loss modules given what they want: log-probabilities to NLLLoss, logits to
    CrossEntropyLoss, a target of the prediction's shape to MSELoss."""
    classifier = nn.Sequential(mlp(8, 16, 4), nn.LogSoftmax(dim=1))
    scorer, regressor = mlp(8, 16, 4), mlp(8, 16, 1)
    nll, ce, mse = nn.NLLLoss(), nn.CrossEntropyLoss(), nn.MSELoss()
    params = [*classifier.parameters(), *scorer.parameters(), *regressor.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(3):
        x, y = data()
        opt.zero_grad()
        loss = nll(classifier(x), y) + ce(scorer(x), y)
        (loss + mse(regressor(x), x.sum(1, keepdim=True))).backward()
        opt.step()


def ok_lbfgs() -> None:
    """LBFGS clears and computes the gradients inside the closure it is given."""
    model = mlp(8, 16, 4)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=2)
    x, y = data()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)


def ok_teacher() -> None:
    """Distillation: a teacher run under no_grad, not in the optimizer."""
    teacher, student = mlp(8, 32, 4), mlp(8, 8, 4)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(3):
        x, _ = data()
        with torch.no_grad():
            target = teacher(x).softmax(1)
        opt.zero_grad()
        F.kl_div(student(x).log_softmax(1), target, reduction="batchmean").backward()
        opt.step()


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (
    item_param, plain_list, model_recreated, no_grad_backbone, cleared_before_step, frozen_all,
    inplace_param, hidden_carried, all_padding, diverges, nan_gradient_applied,
    ok_gan_rerun, ok_adversarial, ok_gradient_penalty, ok_tiny_auxiliary_head, ok_loss_modules,
    ok_lbfgs, ok_teacher)}


if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
    print(f"{sys.argv[1]}: done")

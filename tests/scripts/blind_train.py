"""Training-loop bugs written blind (loop, optimizer, loss, data, mixed precision, several
models), each modelled on a forum question, one per CASE (argv[1]), and healthy look-alikes
(``ok_*``) that must stay silent. Each trains tiny seeded models on CPU for a few steps; the
models' forwards are all correct."""

from __future__ import annotations

import copy
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


def batch(n: int = 16, features: int = 8, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, features), torch.randint(0, classes, (n,))


class Classifier(nn.Module):
    """An encoder and a head (the shape most fine-tuning questions have)."""

    def __init__(self, features: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.encoder = mlp(features, 16, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


class TwoHeads(nn.Module):
    """A trunk with a main head and an auxiliary head, returned as a pair."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = mlp(8, 16)
        self.main = nn.Linear(16, 3)
        self.aux = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return self.main(h), self.aux(h)


def gan_parts() -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, torch.optim.Optimizer]:
    g, d = mlp(4, 16, 8), mlp(8, 16, 1)
    return g, d, torch.optim.Adam(g.parameters(), 1e-3), torch.optim.Adam(d.parameters(), 1e-3)


def d_step(g: nn.Module, d: nn.Module, opt_d: torch.optim.Optimizer, real: torch.Tensor) -> None:
    opt_d.zero_grad()
    fake = g(torch.randn(real.shape[0], 4)).detach()
    ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
    loss = (F.binary_cross_entropy_with_logits(d(real), ones)
            + F.binary_cross_entropy_with_logits(d(fake), zeros))
    loss.backward()
    opt_d.step()


# "GAN generator loss doesn't change, images stay noise": the generator loss goes through
# fake.detach() (copied from the discriminator step), so the generator never gets a gradient.
def gan_g_loss_detached() -> None:
    g, d, opt_g, opt_d = gan_parts()
    for _ in range(STEPS):
        real = torch.randn(16, 8) + 2
        d_step(g, d, opt_d, real)
        opt_g.zero_grad()
        fake = g(torch.randn(16, 4)).detach()
        g_loss = F.binary_cross_entropy_with_logits(d(fake), torch.ones(16, 1))
        g_loss.backward()
        opt_g.step()


# "My discriminator's weights never change": after d_loss.backward() the loop calls opt_g.step()
# (copy-paste), so the discriminator's gradients are computed every step and never applied.
def d_step_wrong_optimizer() -> None:
    g, d, opt_g, opt_d = gan_parts()
    for _ in range(STEPS):
        real = torch.randn(16, 8) + 2
        opt_d.zero_grad()
        fake = g(torch.randn(16, 4))
        d_loss = (F.binary_cross_entropy_with_logits(d(real), torch.ones(16, 1))
                  + F.binary_cross_entropy_with_logits(d(fake.detach()), torch.zeros(16, 1)))
        d_loss.backward()
        opt_g.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(d(g(torch.randn(16, 4))), torch.ones(16, 1))
        g_loss.backward()
        opt_g.step()


# "Critic loss explodes after a few iterations (actor-critic)": zero_grad() is called on the actor's
# optimizer twice, never on the critic's, so the critic's gradients sum over every step.
def zero_grad_wrong_optimizer() -> None:
    actor, critic = mlp(8, 16, 2), mlp(8, 16, 1)
    opt_actor = torch.optim.SGD(actor.parameters(), lr=0.01)
    opt_critic = torch.optim.SGD(critic.parameters(), lr=0.01)
    for _ in range(6):
        s, r = torch.randn(16, 8), torch.randn(16, 1)
        opt_actor.zero_grad()
        value = critic(s)
        critic_loss = F.mse_loss(value, r)
        critic_loss.backward()
        opt_critic.step()
        opt_actor.zero_grad()
        logp = F.log_softmax(actor(s), -1)[:, 0:1]
        actor_loss = -(logp * (r - value.detach())).mean()
        actor_loss.backward()
        opt_actor.step()


# "Loss stops decreasing after the first epoch": StepLR(step_size=1, gamma=0.5) meant per epoch is
# stepped per batch, so after a few dozen batches the learning rate is ~1e-9.
def scheduler_per_batch() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = batch()
    for _ in range(30):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


# "Got 'element 0 of tensors does not require grad', set loss.requires_grad = True, now it doesn't
# learn": the loss was rebuilt from loss.data, a leaf with no graph behind it, so backward reaches
# no parameter.
def loss_requires_grad_hack() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y).data
        loss.requires_grad = True
        loss.backward()
        opt.step()


# "I unfreeze the backbone after 2 epochs but it still doesn't train": the optimizer was built from
# filter(requires_grad) while the backbone was frozen, so it never holds the backbone's parameters.
def unfreeze_not_in_optimizer() -> None:
    model = Classifier()
    model.encoder.requires_grad_(False)
    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.1)
    x, y = batch()
    for step in range(6):
        if step == 2:
            model.encoder.requires_grad_(True)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# "All predictions become the same class, weights go to zero": weight_decay=5 (a typo for 5e-4)
# with lr 0.1, so every step multiplies each weight by 1 - lr*wd = 0.5 before the gradient acts.
def huge_weight_decay() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=5.0)
    x, y = batch()
    for _ in range(8):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# "Loss suddenly becomes NaN at a random batch": the masked mean divides by mask.sum(), and a batch
# where every label is ignored (-1) gives 0/0, whose NaN gradient reaches every weight.
def masked_mean_empty() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    for step in range(STEPS):
        target = torch.full_like(y, -1) if step == 1 else y
        mask = (target != -1).float()
        per_item = F.cross_entropy(model(x), target.clamp(min=0), reduction="none")
        loss = (per_item * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


# "Training in fp16 (model.half()) the first layers don't learn": no GradScaler, and the small
# loss's gradients underflow to zero in float16 on their way back to the early layers.
def fp16_underflow_no_scaler() -> None:
    model = mlp(8, 32, 32, 1).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 8).half()
    y = model(x).detach() + 1e-3
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y) * 1e-3
        loss.backward()
        opt.step()


# "Encoder stops learning after the first validation": the feature-extraction eval helper calls
# requires_grad_(False) on the encoder (to save memory) and never restores it.
def eval_helper_freezes_encoder() -> None:
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def embed_eval(encoder: nn.Module) -> float:
        encoder.eval().requires_grad_(False)
        value = float(encoder(x).norm())
        encoder.train()
        return value

    for step in range(6):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 1:
            embed_eval(model.encoder)


# "The main head's gradients are None": the model returns (main, aux) and the loss is computed on
# the wrong element (out[1]), so the main head never trains.
def loss_on_aux_only() -> None:
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out[1], y).backward()
        opt.step()


# "DQN doesn't learn, Q values blow up": the TD target r + gamma * max Q(s') is computed with the
# online network and not detached, so the gradient also pushes the target (the network chases
# itself).
def dqn_target_not_detached() -> None:
    q = mlp(8, 32, 4)
    opt = torch.optim.Adam(q.parameters(), 1e-2)
    for _ in range(6):
        s, s2 = torch.randn(32, 8), torch.randn(32, 8)
        a, r = torch.randint(0, 4, (32, 1)), torch.randn(32)
        target = r + 0.99 * q(s2).max(1).values
        loss = F.mse_loss(q(s).gather(1, a).squeeze(1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


# "Regression net predicts the same value for every input": output (N, 1) against target (N,)
# broadcasts to (N, N) in mse_loss, so the model is trained towards the mean target.
def mse_broadcast() -> None:
    model = mlp(8, 16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 8)
    y = x.sum(1)
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


# "Loss stuck from the start with images": raw 0-255 pixels fed to a sigmoid network (no
# normalisation), so the first layer's outputs saturate and its gradients vanish.
def unnormalized_input() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.Sigmoid(), nn.Linear(32, 32), nn.Sigmoid(),
                          nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randint(0, 256, (32, 64)).float()
    y = torch.randint(0, 10, (32,))
    for _ in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# Healthy: a standard GAN; the generator step backpropagates through the discriminator (which gets
# gradients that opt_g does not apply and d_step clears).
def ok_gan() -> None:
    g, d, opt_g, opt_d = gan_parts()
    for _ in range(STEPS):
        real = torch.randn(16, 8) + 2
        d_step(g, d, opt_d, real)
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(d(g(torch.randn(16, 4))), torch.ones(16, 1))
        g_loss.backward()
        opt_g.step()


# Healthy: backbone frozen for two steps then unfrozen, with the optimizer holding every parameter.
def ok_unfreeze_schedule() -> None:
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.encoder.requires_grad_(False)
    x, y = batch()
    for step in range(6):
        if step == 2:
            model.encoder.requires_grad_(True)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# Healthy: a mean-teacher EMA copy, never given gradients, moved by lerp under no_grad every step.
def ok_ema_teacher() -> None:
    student = Classifier()
    teacher = copy.deepcopy(student).requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.no_grad():
            soft = F.softmax(teacher(x), -1)
        out = student(x)
        distill = F.kl_div(F.log_softmax(out, -1), soft, reduction="batchmean")
        loss = F.cross_entropy(out, y) + distill
        loss.backward()
        opt.step()
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
                t.lerp_(s, 0.1)


# Healthy: OneCycleLR stepped per batch (as it is meant to be); the last steps' lr is tiny by
# design.
def ok_onecycle() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12)
    x, y = batch()
    for _ in range(12):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


# Healthy: DQN with a separate target network (no gradients, synced by load_state_dict every 3
# steps).
def ok_dqn_target_net() -> None:
    q = mlp(8, 32, 4)
    target_q = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), 1e-2)
    for step in range(6):
        s, s2 = torch.randn(32, 8), torch.randn(32, 8)
        a, r = torch.randint(0, 4, (32, 1)), torch.randn(32)
        with torch.no_grad():
            target = r + 0.99 * target_q(s2).max(1).values
        loss = F.mse_loss(q(s).gather(1, a).squeeze(1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 3 == 2:
            target_q.load_state_dict(q.state_dict())


# Healthy: the masked mean guarded by clamp(min=1), with one batch whose labels are all ignored
# (loss 0).
def ok_masked_guarded() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    for step in range(STEPS):
        target = torch.full_like(y, -1) if step == 1 else y
        mask = (target != -1).float()
        per_item = F.cross_entropy(model(x), target.clamp(min=0), reduction="none")
        loss = (per_item * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()


# Healthy: linear probing, the encoder frozen (and out of the optimizer) for the whole run by
# design.
def ok_linear_probe() -> None:
    model = Classifier()
    model.encoder.requires_grad_(False)
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# Healthy (added after the blind score, beside the weight-decay and schedule findings): AdamW with
# a large but usual weight decay, and a cosine schedule stepped per batch down to 0 at the end.
def ok_adamw_decay_cosine() -> None:
    model = mlp(8, 16, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12)
    x, y = batch()
    for _ in range(12):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in [
    gan_g_loss_detached, d_step_wrong_optimizer, zero_grad_wrong_optimizer, scheduler_per_batch,
    loss_requires_grad_hack, unfreeze_not_in_optimizer, huge_weight_decay, masked_mean_empty,
    fp16_underflow_no_scaler, eval_helper_freezes_encoder, loss_on_aux_only,
    dqn_target_not_detached,
    mse_broadcast, unnormalized_input, ok_gan, ok_unfreeze_schedule, ok_ema_teacher, ok_onecycle,
    ok_dqn_target_net, ok_masked_guarded, ok_linear_probe, ok_adamw_decay_cosine]}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()

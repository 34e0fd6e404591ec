"""Healthy programs from the field that narrow rules took for bugs (issue 48), one per CASE
(argv[1]); each must stay silent (no warning, no error), and its bug twin (``bug_``) must not.

    python field_lookalikes.py CASE

- ``twin_critics``: SAC's actor loss reads ``min(q0, q1)``: the larger head gets exactly zero in
  the actor's pass by design, and a gradient in every critic pass before its optimizer steps.
- ``metric_copy``: a deep copy of the model evaluated once with gradients on, for a metric.
- ``gradcam``: Grad-CAM: a model in eval mode, one backward of a class score, no optimizer.
- ``flops_probe``: a FLOPs count: one no-grad forward on uninitialised memory (NaN here).
- ``nan_next_obs``: a DQN whose terminal next observations are NaN; the target network's
  values there are masked out with ``torch.where`` before the loss reads them.
- ``bug_nan_next_obs``: the same masked by multiplying by ``1 - done``: NaN * 0 is NaN, and the
  loss reads it.
- ``rises_then_falls``: a loss that rises for a few steps (a warm-up overshoot), then falls.
- ``bug_lr_too_high``: Adam at lr 10 for 1e-3: the loss goes up a thousandfold, never NaN.
- ``hinge_met``: a triplet loss whose margin every triplet meets in every other step: the loss
  is exactly 0 there, and so is every gradient, by the loss itself.
- ``bug_grad_cleared``: the last layer's ``.grad`` set to None before every optimizer step: it
  never trains (DINO's freeze left on).
- ``bug_bias_left_out``: the last Linear's weight in the optimizer, its bias not.
- ``frozen_last_layer``: DINO's ``cancel_gradients_last_layer``: the last layer's ``.grad`` set
  to None before each optimizer step of the first epochs, then trained.
"""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 6


def twin_critics() -> None:
    actor = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Tanh())

    class Critic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q0 = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
            self.q1 = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
            with torch.no_grad():
                self.q1[2].bias.fill_(5.0)  # q1 above q0 on every sample: min picks q0

        def forward(self, s: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x = torch.cat([s, a], dim=1)
            return self.q0(x), self.q1(x)

    critic = Critic()
    opt_actor = torch.optim.Adam(actor.parameters(), lr=1e-3)
    opt_critic = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for _ in range(STEPS):
        s, a, target = torch.randn(8, 4), torch.rand(8, 2) * 2 - 1, torch.randn(8, 1)
        q0, q1 = critic(s, a)
        critic_loss = F.mse_loss(q0, target) + F.mse_loss(q1, target)
        opt_critic.zero_grad()
        critic_loss.backward()
        opt_critic.step()
        actor_loss = -torch.min(*critic(s, actor(s))).mean()
        opt_actor.zero_grad()
        actor_loss.backward()
        opt_actor.step()


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Dropout(0.2), nn.Flatten(), nn.Linear(8, 5))


def metric_copy() -> None:
    model = classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    snapshot = copy.deepcopy(model)
    accuracy = (snapshot(torch.randn(4, 3, 8, 8)).argmax(1) == 0).float().mean()
    print(f"accuracy {accuracy.item():.2f}")


def gradcam() -> None:
    model = classifier().eval()
    feats: list[torch.Tensor] = []

    def keep(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        output.retain_grad()
        feats.append(output)

    model[2].register_forward_hook(keep)
    score = model(torch.randn(1, 3, 8, 8))[0, 3]
    score.backward()
    weights = feats[0].grad.mean(dim=(2, 3), keepdim=True)  # type: ignore[union-attr]
    cam = F.relu((weights * feats[0]).sum(1))
    print(f"cam {tuple(cam.shape)}")


def flops_probe() -> None:
    model = classifier()
    with torch.no_grad():
        model(torch.empty(1, 3, 8, 8).fill_(float("nan")))  # what torch.empty may hold
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def nan_next_obs(masked_by_where: bool) -> None:
    q_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    target_net = copy.deepcopy(q_net)
    opt = torch.optim.Adam(q_net.parameters(), lr=1e-3)
    for _ in range(STEPS):
        obs, action, reward = torch.randn(8, 4), torch.randint(0, 2, (8,)), torch.randn(8)
        done = torch.zeros(8, dtype=torch.bool)
        done[-2:] = True
        next_obs = torch.randn(8, 4)
        next_obs[done] = float("nan")  # an environment's terminal observation
        with torch.no_grad():
            best = target_net(next_obs).max(dim=1).values
            future = torch.where(done, 0.0, best) if masked_by_where else (1 - done.float()) * best
            target = reward + 0.99 * future
        q = q_net(obs).gather(1, action[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        opt.zero_grad()
        loss.backward()
        opt.step()


def frozen_last_layer() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = F.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 4))
        opt.zero_grad()
        loss.backward()
        if step < STEPS // 2:  # the first epochs: the last layer does not learn yet
            for p in model[2].parameters():
                p.grad = None
        opt.step()


def adam_at(lr: float, steps: int = 30) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def hinge_met() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        a, p, n = (model(torch.randn(4, 8)) for _ in range(3))
        far = 0.0 if step % 2 == 0 else 100.0  # easy negatives: every margin met, the loss 0
        loss = F.triplet_margin_loss(a, p, n + far, margin=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()


def last_layer_never_trains(case: str) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    params = [p for name, p in model.named_parameters()
              if case != "bias_left_out" or name != "3.bias"]
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(STEPS):
        loss = F.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 4))
        opt.zero_grad()
        loss.backward()
        if case == "grad_cleared":
            for p in model[3].parameters():
                p.grad = None
        opt.step()


def rises_then_falls() -> None:
    adam_at(1.0)  # up 16x in its first steps, then converges


CASES = {
    "twin_critics": twin_critics,
    "metric_copy": metric_copy,
    "gradcam": gradcam,
    "flops_probe": flops_probe,
    "nan_next_obs": lambda: nan_next_obs(True),
    "bug_nan_next_obs": lambda: nan_next_obs(False),
    "frozen_last_layer": frozen_last_layer,
    "rises_then_falls": rises_then_falls,
    "hinge_met": hinge_met,
    "bug_grad_cleared": lambda: last_layer_never_trains("grad_cleared"),
    "bug_bias_left_out": lambda: last_layer_never_trains("bias_left_out"),
    "bug_lr_too_high": lambda: adam_at(10.0),
}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()

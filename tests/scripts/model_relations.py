"""Scripts of several models whose relations over the steps ``check`` states as facts (issue 36,
item 5), one per CASE (argv[1]), all healthy:

    python model_relations.py CASE

* ``gan``: a generator G and a discriminator D, one Adam each, D frozen (``requires_grad_``)
  around the generator's pass, so the passes alternate between them;
* ``gan_in_main``: the same, its models dropped when its function returns and the garbage
  collector run before tracing stops: the models are gone when tracing stops;
* ``mean_teacher``: a teacher made with ``copy.deepcopy`` of the student, frozen, updated as a
  moving average of the student after each step, no optimizer of its own;
* ``dqn``: a Q network and its target network, copied with ``load_state_dict`` every third
  step, the target evaluated under ``torch.no_grad``;
* ``frozen_backbone``: a frozen pretrained feature extractor with a trained head;
* ``single``: one model: nothing to relate.

Everything runs on the CPU on random data, with nothing downloaded.
"""

from __future__ import annotations

import copy
import gc
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


def gan() -> tuple[nn.Module, nn.Module]:
    G = mlp(4, 8, 4)
    D = mlp(4, 8, 1)
    opt_g = torch.optim.Adam(G.parameters(), 1e-3)
    opt_d = torch.optim.Adam(D.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    for _ in range(4):
        real, fake = torch.randn(8, 4), G(torch.randn(8, 4))
        D.requires_grad_(True)
        opt_d.zero_grad()
        (bce(D(real), ones) + bce(D(fake.detach()), zeros)).backward()
        opt_d.step()
        D.requires_grad_(False)
        opt_g.zero_grad()
        bce(D(fake), ones).backward()
        opt_g.step()
    return G, D  # held until tracing stops


def gan_in_main() -> None:
    gan()
    gc.collect()  # G and D are gone before tracing stops


def mean_teacher() -> None:
    student = mlp(4, 8, 2)
    teacher = copy.deepcopy(student)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), 0.1)
    for _ in range(5):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        with torch.no_grad():
            target = teacher(x)
        # the labels' loss, and the consistency with the teacher on a noisy input
        loss = F.cross_entropy(student(x), y) + F.mse_loss(student(x + 0.1 * torch.randn(8, 4)),
                                                           target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
                t.lerp_(s, 0.01)


def dqn() -> None:
    q_net = mlp(4, 16, 2)
    target_net = copy.deepcopy(q_net)
    opt = torch.optim.Adam(q_net.parameters(), 1e-3)
    for step in range(6):
        state, after = torch.randn(8, 4), torch.randn(8, 4)
        action, reward = torch.randint(0, 2, (8, 1)), torch.randn(8)
        with torch.no_grad():
            target = reward + 0.99 * target_net(after).max(1).values
        q = q_net(state).gather(1, action).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 3 == 2:
            target_net.load_state_dict(q_net.state_dict())


def frozen_backbone() -> None:
    features = mlp(8, 16, 16)
    features.requires_grad_(False)
    features.eval()
    head = nn.Linear(16, 3)
    opt = torch.optim.SGD(head.parameters(), 0.1)
    for _ in range(4):
        x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(head(features(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def single() -> None:
    model = mlp(4, 8, 2)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for _ in range(4):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


CASES: dict[str, Callable[[], object]] = {
    "gan": gan, "gan_in_main": gan_in_main, "mean_teacher": mean_teacher, "dqn": dqn,
    "frozen_backbone": frozen_backbone, "single": single}

if __name__ == "__main__":
    torch.manual_seed(0)
    kept = CASES[sys.argv[1]]()

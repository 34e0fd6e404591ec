"""Healthy: TD3 with twin critics, ``min(q1, q2)`` targets, delayed actor updates and Polyak
targets.

Looks like: two critics whose targets take a minimum (one critic's gradient path is cut at
every element where the other is smaller), target networks that are called under no_grad and
never trained, an actor that is stepped only every second step and whose loss reads only
critic1, and critics that also receive a gradient from the actor's loss that is then zeroed.
All of it is TD3 as published: clipped double-Q, target policy smoothing, delayed policy updates.

Asserts: the critics' TD loss falls, both critics are trained, the targets trail the online
networks (Polyak), and the actor moved.

Mirrors: b05 (target network). Source: https://github.com/sfujim/TD3/blob/master/TD3.py.
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn

OBS, ACT, GAMMA, TAU = 4, 2, 0.9, 0.05


def critic():
    return nn.Sequential(nn.Linear(OBS + ACT, 64), nn.ReLU(), nn.Linear(64, 1))


def main():
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(OBS, 64), nn.ReLU(), nn.Linear(64, ACT), nn.Tanh())
    critic1, critic2 = critic(), critic()
    actor_target = copy.deepcopy(actor)
    critic1_target, critic2_target = copy.deepcopy(critic1), copy.deepcopy(critic2)
    opt_actor = torch.optim.Adam(actor.parameters(), lr=1e-3)
    opt_critic = torch.optim.Adam([*critic1.parameters(), *critic2.parameters()], lr=1e-3)
    actor_before = actor[0].weight.detach().clone()
    s = torch.randn(2000, OBS)
    a = torch.rand(2000, ACT) * 2 - 1
    r = -((s[:, :ACT] - a) ** 2).sum(1, keepdim=True)
    s2 = s + 0.1 * torch.randn_like(s)
    losses = []
    for step in range(40):
        idx = torch.randint(0, 2000, (64,))
        with torch.no_grad():
            noise = (0.2 * torch.randn(64, ACT)).clamp(-0.5, 0.5)
            a2 = (actor_target(s2[idx]) + noise).clamp(-1, 1)
            sa2 = torch.cat([s2[idx], a2], 1)
            q_next = torch.min(critic1_target(sa2), critic2_target(sa2))
            y = r[idx] + GAMMA * q_next
        sa = torch.cat([s[idx], a[idx]], 1)
        loss = F.mse_loss(critic1(sa), y) + F.mse_loss(critic2(sa), y)
        opt_critic.zero_grad()
        loss.backward()
        opt_critic.step()
        losses.append(loss.item())
        if step % 2 == 1:
            actor_loss = -critic1(torch.cat([s[idx], actor(s[idx])], 1)).mean()
            opt_actor.zero_grad()
            actor_loss.backward()
            opt_actor.step()
            with torch.no_grad():
                for net, tgt in ((actor, actor_target), (critic1, critic1_target),
                                 (critic2, critic2_target)):
                    for p, tp in zip(net.parameters(), tgt.parameters(), strict=True):
                        tp.mul_(1 - TAU).add_(TAU * p)
        print(f"step {step:2d} critic loss {loss.item():.4f}")
    assert sum(losses[-5:]) < sum(losses[:5])
    assert not torch.equal(actor_before, actor[0].weight)
    assert not torch.equal(critic1[0].weight, critic1_target[0].weight)


if __name__ == "__main__":
    main()

"""Healthy: DQN with a target network made by ``copy.deepcopy`` and soft-updated (Polyak, tau
0.05) under no_grad after every step.

Looks like: a second network that is called every step, never gets a gradient, is in no
optimizer, and whose weights nevertheless change at every step (in place, under no_grad); its
outputs trail the online network's.

Asserts: the target is a distinct object, it changed, it is never equal to the online network,
and Q(start) stays bounded by the true maximum value 1.

Mirrors: b05 (target is the online net). Source:
https://github.com/ufal/npfl122/pull/81 (hard copy vs soft Polyak update of the target network).
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn

N_STATES, GAMMA, TAU = 6, 0.9, 0.05


def one_hot(states):
    return F.one_hot(states, N_STATES).float()


def main():
    torch.manual_seed(0)
    policy_net = nn.Sequential(nn.Linear(N_STATES, 64), nn.ReLU(), nn.Linear(64, 2))
    target_net = copy.deepcopy(policy_net)
    optimizer = torch.optim.Adam(policy_net.parameters(), lr=1e-2)
    s = torch.randint(0, N_STATES - 1, (4000,))
    a = torch.randint(0, 2, (4000,))
    s2 = (s + torch.where(a == 1, 1, -1)).clamp(0, N_STATES - 1)
    r = (s2 == N_STATES - 1).float()
    done = s2 == N_STATES - 1
    start = target_net[0].weight.detach().clone()
    for step in range(40):
        idx = torch.randint(0, 4000, (64,))
        q = policy_net(one_hot(s[idx])).gather(1, a[idx, None]).squeeze(1)
        with torch.no_grad():
            td = r[idx] + GAMMA * target_net(one_hot(s2[idx])).max(1).values * (~done[idx])
        loss = F.mse_loss(q, td)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for p, tp in zip(policy_net.parameters(), target_net.parameters(), strict=True):
                tp.mul_(1 - TAU).add_(TAU * p)
            q_start = policy_net(one_hot(torch.tensor([0]))).max().item()
        print(f"step {step:2d} td loss {loss.item():.4f} Q(start) {q_start:+.3f}")
    assert target_net is not policy_net
    assert not torch.equal(start, target_net[0].weight)
    assert not torch.equal(policy_net[0].weight, target_net[0].weight)
    assert q_start < 1.0


if __name__ == "__main__":
    main()

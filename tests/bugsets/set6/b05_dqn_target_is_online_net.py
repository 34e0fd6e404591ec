"""Bug: the DQN "target network" is the online network itself (``target_net = policy_net``).

The script means to keep a frozen copy for the bootstrapped targets and writes
``target_net = policy_net`` instead of ``copy.deepcopy(policy_net)``; the periodic
``target_net.load_state_dict(policy_net.state_dict())`` then copies the network onto itself.
The TD targets are computed (under no_grad) by the very network being trained, so they move
with every update: the regression chases its own tail and Q-values drift upward without bound
on a chain MDP whose true values are at most 1.

Asserts: target_net is policy_net, the probe targets change between consecutive steps that
are not sync steps, and Q(start) overshoots the true maximum value 1.

Source: https://github.com/AndreaVidali/Deep-QLearning-Agent-for-Traffic-Signal-Control/issues/31
(Q network and target network are the same) and
https://github.com/abhi1345/deep-q-rank/issues/4 (not using a target network).
"""
import torch
import torch.nn.functional as F
from torch import nn

N_STATES, GAMMA, SYNC_EVERY = 6, 0.99, 10


def one_hot(states):
    return F.one_hot(states, N_STATES).float()


def main():
    torch.manual_seed(0)
    policy_net = nn.Sequential(nn.Linear(N_STATES, 64), nn.ReLU(), nn.Linear(64, 2))
    target_net = policy_net  # BUG: meant copy.deepcopy(policy_net)
    optimizer = torch.optim.Adam(policy_net.parameters(), lr=1e-2)
    s = torch.randint(0, N_STATES - 1, (4000,))
    a = torch.randint(0, 2, (4000,))
    s2 = (s + torch.where(a == 1, 1, -1)).clamp(0, N_STATES - 1)
    r = (s2 == N_STATES - 1).float()
    done = s2 == N_STATES - 1
    probe = torch.arange(N_STATES)
    probes = []
    for step in range(40):
        idx = torch.randint(0, 4000, (64,))
        q = policy_net(one_hot(s[idx])).gather(1, a[idx, None]).squeeze(1)
        with torch.no_grad():
            td = r[idx] + GAMMA * target_net(one_hot(s2[idx])).max(1).values * (~done[idx])
            probes.append(target_net(one_hot(probe)).max(1).values)
        loss = F.mse_loss(q, td)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % SYNC_EVERY == 0:
            target_net.load_state_dict(policy_net.state_dict())
        print(f"step {step:2d} td loss {loss.item():.4f} Q(start) {probes[-1][0].item():+.3f}")
    assert target_net is policy_net
    assert not torch.equal(probes[1], probes[2])
    assert probes[-1].max().item() > 1.0, probes[-1]
    print("the target network is the online network: targets move at every update")


if __name__ == "__main__":
    main()

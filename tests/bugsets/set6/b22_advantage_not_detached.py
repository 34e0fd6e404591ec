"""Bug: actor-critic policy loss uses ``returns - value`` without detaching the value.

A shared-trunk actor-critic computes ``advantage = returns - value`` and the policy loss
``-(log_prob * advantage).mean()`` with the value still attached. The policy loss then sends a
gradient into the value head and the trunk through the baseline: the value head is trained by
two objectives, one of which (``+log_prob * value``) pushes the value up wherever the chosen
action's log-probability is negative (always): the critic's estimates drift above the returns.

Asserts: the gradient reaching the value differs from the value loss's own gradient (the
policy loss adds to it), and the mean value ends above the mean return.

Source: https://github.com/astariul/encode-attend-navigate-pytorch/issues/2 (critic not detached
from the policy loss) and https://github.com/keras-team/keras-io/issues/194 (stop_gradient
missing on the value in the actor loss).
"""
import torch
import torch.nn.functional as F
from torch import nn


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(8, 64), nn.Tanh())
        self.policy_head = nn.Linear(64, 4)
        self.value_head = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.policy_head(h), self.value_head(h).squeeze(-1)


def main():
    torch.manual_seed(0)
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        obs = torch.randn(64, 8)
        logits, value = model(obs)
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        returns = (action == obs[:, :4].argmax(1)).float()  # reward 1 for the right action
        advantage = returns - value  # BUG: value.detach()
        policy_loss = -(dist.log_prob(action) * advantage).mean()
        value_loss = F.mse_loss(value, returns)
        seen = {}
        value.register_hook(lambda g, seen=seen: seen.update(g=g))
        optimizer.zero_grad()
        (policy_loss + 0.5 * value_loss).backward()
        from_value_loss = (value - returns).detach() / len(value)  # d(0.5 * mse) / d value
        assert not torch.allclose(seen["g"], from_value_loss)
        optimizer.step()
        print(f"step {step:2d} return {returns.mean().item():.3f} value {value.mean().item():.3f}")
    assert value.mean().item() > returns.mean().item()
    print("the policy loss trains the critic: values drift above the returns")


if __name__ == "__main__":
    main()

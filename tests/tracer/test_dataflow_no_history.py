"""Data flow where autograd records nothing between two calls (issue 47, item 4): SB3's critic
runs its features extractor under ``set_grad_enabled(False)`` (shared with the actor) and reads
``torch.cat([features, actions])``, a tensor that needs no gradient, made with gradients on. The
critic's heads are made from its features all the same; an actor that flattens the same
observations afterwards did not read them from the critic."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import hooktrace
from hooktrace.log import schema
from hooktrace.log.reader import LogReader


class Critic(nn.Module):
    """SB3's ``ContinuousCritic`` with a features extractor it does not train."""

    def __init__(self, features: nn.Module, n_features: int) -> None:
        super().__init__()
        self.features = features
        self.q0, self.q1 = nn.Linear(n_features + 2, 1), nn.Linear(n_features + 2, 1)

    def forward(self, obs: torch.Tensor, act: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(False):
            features = self.features(obs)
        flat = features.view(len(features), -1)  # kept: the critic returns what it read
        x = torch.cat([flat, act], 1)
        return self.q0(x), self.q1(x), flat


class Actor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features, self.mu = nn.Flatten(), nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mu(self.features(obs))


def producers(features: nn.Module, n_features: int, tmp_path: Path) -> dict[str, list[list[str]]]:
    """Per call (fqn), the fqns of the calls that made each of its inputs, in one recorded step
    of a critic's and then an actor's training."""
    torch.manual_seed(0)
    critic, actor = Critic(features, n_features), Actor()
    log = tmp_path / "sac.jsonl"
    obs, act = torch.randn(3, 4), torch.randn(3, 2)
    with hooktrace.trace(log):
        q0, q1, _kept = critic(obs, act)
        (q0 + q1 - actor(obs).sum(1, keepdim=True)).sum().backward()
    assert torch._C._len_torch_dispatch_stack() == 0  # the follower went with the critic's call
    forward = [e for e in LogReader(log, flow=True)
               if isinstance(e, schema.ForwardEvent) and e.phase == "forward"]
    fqn = {e.seq: f"{e.model}:{e.fqn}" for e in forward}
    return {f"{e.model}:{e.fqn}": [[fqn[s] for s in calls] for calls in e.inputs_from or []]
            for e in forward}


def test_a_cat_of_features_made_under_no_grad_reaches_the_critic_heads(tmp_path: Path) -> None:
    """Before: the heads' input was made by no call (an edge autograd leaves empty)."""
    found = producers(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), 4, tmp_path)
    assert found["0:q0"] == found["0:q1"] == [["0:features"]]
    assert found["0:features.1"] == [["0:features.0"]]
    assert found["1:features"] == [[]] and found["1:mu"] == [["1:features"]]


def test_a_flatten_that_returns_the_observations_is_not_their_maker_later(
        tmp_path: Path) -> None:
    """The healthy look-alike: the critic's extractor is an ``nn.Flatten`` of 2-d observations,
    which returns them unchanged. Inside the critic its heads read them from it; the actor,
    which flattens the same observations afterwards (while a view the critic made of them is
    alive), read them from no call."""
    found = producers(nn.Flatten(), 4, tmp_path)
    assert found["0:q0"] == found["0:q1"] == [["0:features"]]
    assert found["1:features"] == [[]] and found["1:mu"] == [["1:features"]]

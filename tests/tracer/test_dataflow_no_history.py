"""Data flow where autograd records nothing between two calls (issue 47, item 4): SB3's critic
reads ``torch.cat([features, actions])``, a tensor that needs no gradient, made with gradients
on, from features it made under ``set_grad_enabled(False)`` (an extractor shared with the
actor) or, by default (``share_features_extractor=False``), with gradients on by an
``nn.Flatten`` that returns the 2-d observations as they are. The critic's heads are made from
its features all the same; an actor that flattens the same observations afterwards did not read
them from the critic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.hooks import follower
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


class DefaultCritic(nn.Module):
    """SB3's ``ContinuousCritic`` as SAC and TD3 make it by default: its own ``nn.Flatten``
    extractor, run with gradients on, and two Q networks."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.features = nn.Flatten()
        self.q0 = nn.Sequential(nn.Linear(width + 2, 8), nn.ReLU(), nn.Linear(8, 1))
        self.q1 = nn.Sequential(nn.Linear(width + 2, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, obs: torch.Tensor, act: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat([self.features(obs), act], dim=1)
        return self.q0(x), self.q1(x), x


class Actor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features, self.mu = nn.Flatten(), nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mu(self.features(obs))


def producers(critic: nn.Module, tmp_path: Path, obs: torch.Tensor | None = None,
              act: torch.Tensor | None = None) -> dict[str, list[list[str]]]:
    """Per call (fqn), the fqns of the calls that made each of its inputs, in one recorded step
    of a critic's and then an actor's training (on 2-d observations unless given)."""
    torch.manual_seed(0)
    actor = Actor()
    log = tmp_path / "sac.jsonl"
    obs = torch.randn(3, 4) if obs is None else obs
    act = torch.randn(3, 2) if act is None else act
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
    found = producers(Critic(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), 4), tmp_path)
    assert found["0:q0"] == found["0:q1"] == [["0:features"]]
    assert found["0:features.1"] == [["0:features.0"]]
    assert found["1:features"] == [[]] and found["1:mu"] == [["1:features"]]


def test_a_flatten_that_returns_the_observations_is_not_their_maker_later(
        tmp_path: Path) -> None:
    """The healthy look-alike: the critic's extractor is an ``nn.Flatten`` of 2-d observations,
    which returns them unchanged. Inside the critic its heads read them from it; the actor,
    which flattens the same observations afterwards (while a view the critic made of them is
    alive), read them from no call."""
    found = producers(Critic(nn.Flatten(), 4), tmp_path)
    assert found["0:q0"] == found["0:q1"] == [["0:features"]]
    assert found["1:features"] == [[]] and found["1:mu"] == [["1:features"]]


def test_the_default_critic_s_heads_read_what_its_flatten_returned(tmp_path: Path) -> None:
    """SAC's and TD3's default critic: its ``nn.Flatten`` returns the observations (no autograd
    history), and the ``cat`` with the replay buffer's actions runs with gradients on. Before:
    each Q network's first layer read data made by no call; on 1x2x4 observations too, which
    the ``Flatten`` reshapes into a view it made. The actor's extractor, which flattens the same
    observations afterwards, still read them from no call."""
    for obs in torch.randn(3, 4), torch.randn(3, 1, 2, 2):
        found = producers(DefaultCritic(), tmp_path, obs=obs)
        assert found["0:q0.0"] == found["0:q1.0"] == [["0:features"]]
        assert found["0:q0.2"] == [["0:q0.1"]] and found["0:q1.1"] == [["0:q1.0"]]
        assert found["1:features"] == [[]] and found["1:mu"] == [["1:features"]]


def test_actions_with_history_leave_the_cat_to_autograd(tmp_path: Path) -> None:
    """The healthy look-alike: actions from the actor (they need a gradient) make the ``cat``
    autograd's, which sees the actions' maker only (none here), as before."""
    found = producers(DefaultCritic(), tmp_path, act=torch.randn(3, 2, requires_grad=True))
    assert found["0:q0.0"] == found["0:q1.0"] == [[]]
    assert found["1:features"] == [[]]


class Probe(nn.Module):
    """Runs its children one after the other, and says whether data flow's follower of
    operations is on this thread's stack as its forward begins and after each child returned
    (in its own code)."""

    def __init__(self, *children: nn.Module) -> None:
        super().__init__()
        self.children_ = nn.ModuleList(children)
        self.seen: list[tuple[bool, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seen = [following()]
        for child in self.children_:
            x = child(x)
            seen.append(following())
        self.seen.append(tuple(seen))
        return x


def following() -> bool:
    return any(isinstance(torch._C._get_dispatch_stack_at(i), follower.Follower)
               for i in range(torch._C._len_torch_dispatch_stack()))


def test_the_follower_is_on_only_in_the_code_around_data_without_history(
        tmp_path: Path) -> None:
    """On in the critic's code after its ``Flatten`` returned the observations, off while a
    call with gradients on runs in that code (the Q network's operations are autograd's), on
    after it, off once the critic returned; in recorded steps only. Never on in the code around
    calls that all return data with autograd history (the healthy look-alike)."""
    q_net = Probe(nn.Linear(6, 1))
    critic = Probe(nn.Flatten(), q_net, nn.Identity())
    plain = Probe(nn.Linear(6, 6), Probe(nn.Linear(6, 1)))
    between = []
    with hooktrace.trace(tmp_path / "f.jsonl", steps="0"):
        for _ in range(2):  # step 1 is watched
            critic(torch.randn(3, 6)).sum().backward()
            between.append(following())
            plain(torch.randn(3, 6)).sum().backward()
            between.append(following())
    assert critic.seen == [(False, True, True, True), (False,) * 4] and between == [False] * 4
    assert q_net.seen == [(False, False)] * 2
    assert plain.seen == [(False,) * 3] * 2 and plain.children_[1].seen == [(False,) * 2] * 2


class Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flat = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.flat(x)  # no autograd history: the follower is on in the code after it
        (f * 2).sum()
        self.inside = following()
        raise ValueError("the program's own error")


def test_the_follower_is_off_once_a_model_call_raised(tmp_path: Path) -> None:
    """A model call that raised after its follower went on leaves nothing on the program's
    stack: the program that catches the error goes on without hooktrace's mode under its own."""
    model = Raises()
    with hooktrace.trace(tmp_path / "r.jsonl", steps="0"):
        with pytest.raises(ValueError, match="the program's own error"):
            model(torch.randn(3, 2, 2))
        after = following()
    assert model.inside and not after

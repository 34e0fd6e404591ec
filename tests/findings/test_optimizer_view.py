"""What the optimizer holds versus what the model is (issue 26, family 1): unregistered modules
each under a name of their own, a module set on a ``DataParallel`` wrapper that never runs, two
Parameters over one storage in one optimizer, an optimizer stepped again with the same
gradients, the parameters an optimizer holds that its model no longer has; and the healthy
look-alikes of each, silent. Real ``hooktrace run`` / ``check --json`` runs
(``scripts/optimizer_view.py``), and in-process traces where the log itself is asserted."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from helpers import Cases, Run, Shared, events, problems, read_log, run_cases, run_findings
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.log import schema
from hooktrace.observe import optimizer_view

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "optimizer_view.py"

# the bugs -> their problems (kind, severity, model, module, step), in check's order
BUGS: dict[str, list[tuple[Any, ...]]] = {
    "dict_heads": [("not-optimized", "warning", "model", "(heads['a'])", None)],
    "nested_list": [("not-optimized", "warning", "model", "(Linear)", None)],
    "params_from_one_tensor": [("shared-storage", "warning", "model", "", 0)],
    "stepped_three_times": [("stepped-twice", "warning", "model", "", 0)],
}
HEALTHY = ["ok_module_list_dict", "ok_frozen_unused", "ok_dataparallel", "ok_parametrize_unsafe",
           "ok_orthogonal_after_opt", "ok_views_not_tied", "ok_swa_ema", "ok_accum_flush",
           "ok_lbfgs"]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "optview", [*BUGS, *HEALTHY], lambda _: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_bug_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == BUGS[case]
    assert status == 1


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0


def test_each_unregistered_module_has_a_name_of_its_own(runs: dict[str, Run]) -> None:
    """Two heads in a plain dict, two layers in a list of lists: two names each, never one
    module 'called twice'."""
    for case, names in (("dict_heads", ["(heads['a'])", "(heads['b'])"]),
                        ("nested_list", ["(Linear)", "(Linear#2)"])):
        _, found = run_findings(runs[case])
        assert found[0]["evidence"]["modules"] == names
        assert not [f for f in found if f["cause"] == "called-several-times"]


def test_what_the_messages_say(runs: dict[str, Run]) -> None:
    _, found = run_findings(runs["params_from_one_tensor"])
    assert "holds scale_a, scale_b, 2 different Parameters over one storage" in found[0]["message"]
    assert "model.scale_b = model.scale_a" in found[0]["hint"]
    _, found = run_findings(runs["stepped_three_times"])
    assert "stepped 3 times after one backward pass, in steps 0, 1, 2" in found[0]["message"]


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def test_names_of_list_blocks_stay_the_same_at_every_step(log_path: Path) -> None:
    torch.manual_seed(0)
    model = Blocks()
    with hooktrace.trace(log_path):
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
    for step in range(3):
        assert [(e.fqn, e.call) for e in events(log_path, "forward", step)] == [
            ("(blocks[0]).0", 0), ("(blocks[0]).1", 0), ("(blocks[0])", 0),
            ("(blocks[1]).0", 0), ("(blocks[1]).1", 0), ("(blocks[1])", 0), ("", 0)]


class Rebuilt(nn.Module):
    """Two layers built anew at every call and registered (``self.a``, ``self.b``): each is
    named by its attribute, and keeps its name from step to step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        return self.b(self.a(x))  # type: ignore[no-any-return]


def test_layers_rebuilt_at_each_call_keep_their_names(log_path: Path) -> None:
    model = Rebuilt()
    with hooktrace.trace(log_path):
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
    for step in range(3):
        assert [e.fqn for e in events(log_path, "forward", step)] == ["a", "b", ""]


def signals(path: Path, kind: str) -> list[schema.Signal]:
    return [r for r in read_log(path) if isinstance(r, schema.Signal) and r.kind == kind]


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.body(x)))  # type: ignore[no-any-return]


def test_the_head_on_the_wrapper_is_named_beside_the_model(log_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.DataParallel(Classifier())
    model.fc = nn.Linear(4, 3)
    with hooktrace.trace(log_path):
        model(torch.randn(2, 8)).sum().backward()
    modules = {r.fqn: r for r in read_log(log_path) if isinstance(r, schema.Module)}
    assert modules["(DataParallel).fc"].wrapper == "DataParallel"
    assert modules["fc"].wrapper is None


def test_the_optimizer_holds_the_replaced_weight(log_path: Path) -> None:
    """weight_norm after the optimizer: it holds the old weight, which no module has."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    nn.utils.parametrizations.weight_norm(model[2])
    with hooktrace.trace(log_path):
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
            opt.step()
    last = signals(log_path, "optimizers")[-1]
    assert last.detail["not_held"] == ["2.parametrizations.weight"]
    assert (last.detail["outside"], last.detail["outside_count"]) == ([[3, 6]], 1)


def test_what_the_optimizer_holds_is_looked_at_once(log_path: Path) -> None:
    """The look at its parameters (shared storage, parameters outside the model) runs at each
    optimizer's first step only; later steps look at one gradient."""
    looks = {optimizer_view.OptimizerView._shared.__code__: 0,
             optimizer_view.OptimizerView._outside.__code__: 0}

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in looks:
            looks[frame.f_code] += 1

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1),
            torch.optim.Adam(model[2].parameters(), lr=0.1)]
    sys.setprofile(count)
    try:
        with hooktrace.trace(log_path):
            for _ in range(5):
                for opt in opts:
                    opt.zero_grad()
                F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
                for opt in opts:
                    opt.step()
    finally:
        sys.setprofile(None)
    assert list(looks.values()) == [2, 2]
    assert [s.detail for s in signals(log_path, "optimizer-steps") if "again" in s.detail] == []

"""Models of one structure side by side (``observe/twins.py``), traced for real: which hold the
same weights, which changed, which an optimizer steps, and which were replaced after their
optimizer's step by another's weights; an EMA copy never called is found in the loop's
variables; a single model, and models of other structures, write nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.log import schema
from hooktrace.log.reader import LogReader


def mlp(hidden: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def twins(log: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(r.step, r.detail) for r in LogReader(log)
            if isinstance(r, schema.Signal) and r.kind == "twins"]


def lerp(ema: nn.Module, model: nn.Module) -> None:
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters(), strict=True):
            e.lerp_(p, 0.1)


def loop(log: Path, model: nn.Module, after: Any, teacher: nn.Module | None = None) -> None:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hooktrace.trace(log, steps="0:4"):
        for step in range(4):
            x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
            if teacher is not None:
                with torch.no_grad():
                    teacher(x)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            after(step)


def test_a_target_copied_at_every_step(tmp_path: Path) -> None:
    critic, target = mlp(), mlp()
    target.requires_grad_(False)
    loop(tmp_path / "log.jsonl", critic, lambda _: target.load_state_dict(critic.state_dict()),
         teacher=target)
    found = twins(tmp_path / "log.jsonl")
    assert [step for step, _ in found] == [0, 1, 2, 3]
    # named as the loop's variables: the target is ``teacher``, the critic ``model``
    assert found[0][1] == {"models": ["teacher", "model"], "same": [], "changed": [],
                           "unchanged": [], "trained": []}
    assert found[2][1] == {"models": ["teacher", "model"], "same": [["teacher", "model"]],
                           "changed": ["teacher", "model"], "unchanged": [],
                           "trained": ["model"]}


def test_an_ema_copied_back_into_the_model_is_found_uncalled(tmp_path: Path) -> None:
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())

    def after(step: int) -> None:
        lerp(ema, model)
        if step % 2 == 1:
            model.load_state_dict(ema.state_dict())

    loop(tmp_path / "log.jsonl", model, after)
    found = dict(twins(tmp_path / "log.jsonl"))
    # ema, never called, is found at step 0's optimizer step: compared from step 1 on
    assert sorted(found) == [1, 2, 3]
    assert found[2]["replaced"] == ["model"] and found[2]["same"] == [["model", "ema"]]
    assert "replaced" not in found[1] and "replaced" not in found[3]


def test_an_ema_that_never_changes(tmp_path: Path) -> None:
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())
    loop(tmp_path / "log.jsonl", model, lambda _: None, teacher=ema)
    found = twins(tmp_path / "log.jsonl")
    assert found[0][1]["same"] == [["teacher", "model"]]
    assert len(found) == 4 and all(d["unchanged"] == ["teacher"] and d["changed"] == ["model"]
                                   for _, d in found[1:])


def test_one_model_or_other_structures_write_nothing(tmp_path: Path) -> None:
    model, teacher = mlp(), mlp(hidden=32)
    loop(tmp_path / "a.jsonl", model, lambda _: None, teacher=teacher)
    assert twins(tmp_path / "a.jsonl") == []
    loop(tmp_path / "b.jsonl", mlp(), lambda _: None)
    assert twins(tmp_path / "b.jsonl") == []


def test_tracing_changes_no_weight(tmp_path: Path) -> None:
    def run(traced: bool) -> list[torch.Tensor]:
        torch.manual_seed(1)
        model, ema = mlp(), mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
            with hooktrace.trace(tmp_path / f"{traced}{step}.jsonl") if traced else _Nothing():
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            lerp(ema, model)
        return [p.detach().clone() for p in [*model.parameters(), *ema.parameters()]]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True), strict=True))


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: Any) -> None:
        return None

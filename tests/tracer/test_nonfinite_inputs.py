"""The first call of a step whose output holds NaN/Inf, traced for real: a ``nonfinite-inputs``
signal where the NaN came in through its inputs (made by the forward around it), none where
the call made it itself."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import hooktrace
from hooktrace.log import schema
from hooktrace.log.reader import LogReader


class Parent(nn.Module):
    """``sqrt`` of a negative number in its own forward, between its two children."""

    def __init__(self, inside: bool) -> None:
        super().__init__()
        self.inside = inside
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if not self.inside:
            h = torch.sqrt(h - 100.0)  # NaN made here, in the parent's own code
        return self.b(h)


class LogLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(super().forward(x) - 100.0)  # NaN made by the child itself


def signals(path: Path) -> list[schema.Signal]:
    return [r for r in LogReader(path) if isinstance(r, schema.Signal)
            and r.kind == "nonfinite-inputs"]


def run(path: Path, model: nn.Module) -> list[schema.Signal]:
    with hooktrace.trace(path, steps="0:2"):
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
    return signals(path)


def test_a_nan_made_by_the_parent_reaches_the_child_in_its_input(tmp_path: Path) -> None:
    found = run(tmp_path / "log.jsonl", Parent(inside=False))
    assert [(s.step, s.fqn) for s in found] == [(0, "b"), (1, "b")]
    assert found[0].detail["inputs"][0][0] == 0 and found[0].detail["inputs"][0][1] > 0


def test_a_nan_the_child_makes_itself_has_none(tmp_path: Path) -> None:
    model = Parent(inside=True)
    model.b = LogLinear(4, 4)
    assert run(tmp_path / "log.jsonl", model) == []

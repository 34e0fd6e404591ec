"""What went into a call's outputs without autograd history (``ForwardEvent.made_no_history``):
a detached result added or concatenated into them, a buffer added in, a floating output without
history beside one with it, a walk past its bound; not a parent returning its child's output, a
residual over traced calls, an integer output, a call under ``no_grad``. Real models, traced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.hooks import dataflow
from hooktrace.log import schema
from hooktrace.log.reader import LogReader

Second = Callable[["Twice", torch.Tensor, torch.Tensor], object]


class Twice(nn.Module):
    """``a`` then ``b`` on the input; ``out`` makes the output of ``a``'s result, ``b`` and the
    input."""

    def __init__(self, out: Second) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(3, 3), nn.Linear(3, 3), out
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x: torch.Tensor) -> object:
        return self.out(self, self.a(x), x)


def chain(m: Twice, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    for _ in range(dataflow.MAX_NODES + 1):
        h = h * 1.0001
    return h


CASES: dict[str, tuple[Second, bool]] = {
    "returns a's output": (lambda m, a, x: (m.b(x).detach().norm(), a)[1], False),
    "a residual over traced calls": (lambda m, a, x: a + m.b(a), False),
    "an integer output beside": (lambda m, a, x: (a, m.b(x).argmax(1)), False),
    "a + b(x).detach()": (lambda m, a, x: a + m.b(x).detach(), True),
    "cat([a, b(x).detach()])": (lambda m, a, x: torch.cat([a, m.b(x).detach()], 1), True),
    "a buffer added in": (lambda m, a, x: a + m.shift, True),
    "the model's input added in": (lambda m, a, x: a + x, True),
    "b(x).detach() returned beside": (lambda m, a, x: (a, m.b(x).detach()), True),
    "a walk past its bound": (chain, True),
}


def root(tmp_path: Path, out: Second, grad: bool = True) -> schema.ForwardEvent:
    """The forward event of the model's call, traced for one step."""
    log = tmp_path / "log.jsonl"
    torch.manual_seed(0)
    model = Twice(out)
    with hooktrace.trace(log, model=model), torch.set_grad_enabled(grad):
        result = model(torch.randn(2, 3))
        first = result[0] if isinstance(result, tuple) else result
        if grad:
            first.sum().backward()
    reader = LogReader(log)
    assert reader.header.made_no_history
    [event] = [e for e in reader if isinstance(e, schema.ForwardEvent) and e.fqn == ""]
    return event


@pytest.mark.parametrize("case", list(CASES))
def test_what_went_in_without_history_is_said(tmp_path: Path, case: str) -> None:
    out, expected = CASES[case]
    assert root(tmp_path, out).made_no_history is expected


def test_a_call_under_no_grad_says_nothing(tmp_path: Path) -> None:
    """No output carries history: no gradient can come back into it, nothing to say."""
    assert root(tmp_path, CASES["a + b(x).detach()"][0], grad=False).made_no_history is False

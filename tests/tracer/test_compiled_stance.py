"""Recorded steps force the eager stance of torch.compile'd code, and tracing puts the
program's own stance back: after the recorded steps, on exit, and after an exception."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo import eval_frame

import hooktrace


def _stance() -> str:
    return eval_frame._stance.stance


def test_the_stance_is_eager_while_recorded_and_put_back(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    seen = []
    with hooktrace.trace(tmp_path / "log.jsonl", steps="0:2"):
        for _ in range(3):
            seen.append(_stance())
            model(torch.randn(3, 4)).sum().backward()
        seen.append(_stance())
    assert seen == ["force_eager", "force_eager", "default", "default"]
    assert _stance() == "default"


def test_the_programs_own_stance_is_put_back_after_an_exception(tmp_path: Path) -> None:
    torch.compiler.set_stance("eager_on_recompile")
    try:
        with pytest.raises(ValueError), hooktrace.trace(tmp_path / "log.jsonl"):
            assert _stance() == "force_eager"
            raise ValueError("the script's own error")
        assert _stance() == "eager_on_recompile"
    finally:
        torch.compiler.set_stance("default")

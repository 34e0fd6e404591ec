"""Shared helpers: read a log back, run the real ``hooktrace`` command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hooktrace.log import schema
from hooktrace.log.reader import LogReader

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
GOLDEN = ROOT / "tests" / "golden"


def assert_golden(name: str, text: str) -> None:
    """Compare with the text golden tests/golden/NAME; HOOKTRACE_REGEN_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("HOOKTRACE_REGEN_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden {path}: run with HOOKTRACE_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"differs from {path}; if intended, regenerate with HOOKTRACE_REGEN_GOLDEN=1")


def read_log(path: str | os.PathLike[str]) -> list[schema.Record]:
    """Every record of a log, header first."""
    reader = LogReader(path)
    return [reader.header, *reader]


def events(path: str | os.PathLike[str], phase: str | None = None, step: int | None = None
           ) -> list[schema.ForwardEvent | schema.BackwardEvent]:
    """The log's events in file order, optionally of one phase and/or one step."""
    return [r for r in LogReader(path)
            if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent))
            and (phase is None or r.phase == phase) and (step is None or r.step == step)]


def names(path: str | os.PathLike[str], phase: str, step: int = 0) -> list[str]:
    return [e.name for e in events(path, phase, step)]


def hooktrace_cmd(*args: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
                  timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hooktrace ARGS`` for real and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", *map(str, args)], cwd=cwd, capture_output=True,
        text=True, timeout=timeout, **kwargs,  # type: ignore[call-overload]
    )


#: a real ``hooktrace run`` of a case, and ``hooktrace check --json`` of its log
Run = tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]


def run_cases(tmp: Path, cases: Sequence[str], script: Callable[[str], Path]) -> dict[str, Run]:
    """Each case traced (``hooktrace run -o TMP/CASE.jsonl SCRIPT CASE``, ``script(case)``
    says which script) and checked (``check --json``) once, two at a time: each run is mostly
    torch's import."""
    def run(case: str) -> Run:
        log = tmp / f"{case}.jsonl"
        return (hooktrace_cmd("run", "-o", log, script(case), case),
                hooktrace_cmd("check", "--json", log))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(cases, pool.map(run, cases), strict=True))


def run_findings(run: Run) -> tuple[int, list[dict[str, Any]]]:
    """check's exit status and findings, once the run and the check both ended as they may."""
    traced, check = run
    assert traced.returncode == 0, traced.stderr
    assert check.returncode in (0, 1), check.stderr
    return check.returncode, json.loads(check.stdout)["findings"]


def problems(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(kind, severity, model, module, step) of each finding that is not a note, in order."""
    return [(f["kind"], f["severity"], f["model"], f["module"], f["step"]) for f in found
            if f["severity"] != "note"]


def resnet18_step(device: str = "cpu", size: int = 32) -> tuple[Any, Callable[[], None]]:
    """A torchvision resnet18 (10 classes, seed 0) and one SGD training step of it on a fixed
    batch of 2 images of ``size`` x ``size`` on ``device``."""
    import torch
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).to(device)
    x = torch.randn(2, 3, size, size, device=device)
    target = torch.tensor([1, 2], device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), target).backward()
        optimizer.step()

    return model, step


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "trace.jsonl"

"""Counts in what the commands print agree with their number: "1 note", "1 file", "1 row",
never "1 notes" (real runs of tiny scripts, read by the real commands)."""

from __future__ import annotations

from pathlib import Path

from helpers import hooktrace_cmd

from hooktrace.show.view import view_page

# one module called twice in a step: one note (called-several-times), no problem
_TWICE = """
import torch
from torch import nn


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


net = Twice()
net(torch.randn(3, 4)).sum().backward()
"""

# one module call, under no_grad: one event, one captured file
_ONCE = """
import torch
from torch import nn

net = nn.Linear(4, 2)
with torch.no_grad():
    net(torch.randn(3, 4))
"""


def _run(tmp_path: Path, name: str, source: str, *options: str) -> tuple[Path, str]:
    """The log of a traced run of ``source``, and the run's stderr."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    log = tmp_path / f"{name}.jsonl"
    result = hooktrace_cmd("run", "-o", log, *options, script)
    assert result.returncode == 0, result.stderr
    return log, result.stderr


def test_one_note_one_step_one_rank(tmp_path: Path) -> None:
    log, _ = _run(tmp_path, "twice", _TWICE)
    checked = hooktrace_cmd("check", log)
    assert checked.returncode == 0 and "No problems found (1 note)." in checked.stdout
    html, _ = view_page([log])
    assert "1 rank · 1 recorded step · ok · 0 problems, 1 note<" in html
    shown = hooktrace_cmd("show", log, "--limit", "5")
    assert "... 1 more event: --limit 0 shows all" in shown.stdout, shown.stdout


def test_one_event_one_file_one_row(tmp_path: Path) -> None:
    log, said = _run(tmp_path, "once", _ONCE, "--capture", "*")
    capture = tmp_path / "once.capture"
    assert len(list(capture.rglob("*.pt"))) == 1
    assert f"hooktrace: 1 event, 0 steps, 1 tensor file in {capture} -> {log}" in said
    checked = hooktrace_cmd("check", log)
    assert checked.stdout.splitlines()[:2] == [
        f"hooktrace check {log}: 0 steps, 1 event",
        f"captured tensors (torch.load): {capture} (1 file)"]
    exported = hooktrace_cmd("export", log, "-o", tmp_path / "once.csv")
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.splitlines()[-1] == (
        f"hooktrace: wrote {tmp_path / 'once.csv'}: 1 row (csv)")

"""The unrolled-loop log workload: ``check``, ``view`` and ``render`` on logs whose steps hold many
calls of the same modules, time per event at 100, 1,000 and 10,000 calls per step.

The model is pytorch/examples ``time_sequence_prediction``'s: two ``LSTMCell`` and a ``Linear``
called once per time step (3 calls a time step, plus the root: ``T = calls // 3``). Each size
traces two steps of it (statistics on) and repeats the second into a log of about the same
number of events (``logtools.write_log``), so the three sizes differ only in calls per step and
their times per event compare directly. A fourth log is the issue's case: T = 999 (2,998 calls
a step) for 10 steps, 59,960 events, which ``check`` must read in under 5 s.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import logtools

CALLS = (100, 1_000, 10_000)  # per step: the sizes compared
EVENTS = 60_000  # about this many events in each compared log (quick: a third)
TSP = (999, 10)  # the issue's log: time steps, steps
TOOLS = ("check", "view", "render")


class Sequence2(nn.Module):
    """time_sequence_prediction's ``Sequence``: its loop runs every cell once per time step."""

    def __init__(self, hidden: int = 51) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = h2 = c2 = torch.zeros(x.size(0), self.hidden)
        outputs = []
        for t in range(x.size(1)):
            h, c = self.lstm1(x[:, t:t + 1], (h, c))
            h2, c2 = self.lstm2(h, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, 1)


def _step(model: nn.Module, time_steps: int) -> Callable[[], None]:
    torch.manual_seed(0)
    x = torch.sin(torch.arange(time_steps, dtype=torch.float32) / 20).repeat(3, 1)
    target = torch.roll(x, -1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()

    return step


def _argv(tool: str, log: Path, folder: Path) -> list[str]:
    head = [sys.executable, "-m", "hooktrace", tool, str(log)]
    if tool == "check":
        return head
    if tool == "view":
        return [*head, "-o", str(folder / "view.html")]
    return [*head, "--format", "dot", "-o", str(folder / "render.dot")]


def _measure(template: logtools.Template, events: int, repeats: int, folder: Path,
             tools: Sequence[str]) -> list[dict[str, Any]]:
    log = folder / "unrolled.jsonl"
    written = logtools.write_log(template, events, log)
    runs: dict[str, list[logtools.ToolRun]] = {tool: [] for tool in tools}
    for _ in range(repeats):  # the tools alternate: they see the same load
        for tool in tools:
            runs[tool].append(logtools.run_child(_argv(tool, log, folder), (0, 1)))
    calls = sum(r["type"] == "forward" for r in template.step)
    rows = []
    for tool in tools:
        cpu = statistics.median(r.cpu for r in runs[tool])
        rows.append({
            "calls_per_step": calls, "events": written,
            "steps": written // template.events, "file_mb": log.stat().st_size / 2**20,
            "tool": tool, "cpu_s": cpu, "wall_s": statistics.median(r.wall for r in runs[tool]),
            "peak_mb": max(r.peak_mb for r in runs[tool]), "us_per_event": cpu / written * 1e6,
            "repeats": repeats,
        })
    log.unlink()
    return rows


def measure(quick: bool, folder: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    """Per size and tool: median CPU and wall seconds, peak memory, microseconds per event;
    and the issue's 60k-event log."""
    repeats = 1 if quick else 3
    events = EVENTS // 3 if quick else EVENTS
    rows: list[dict[str, Any]] = []
    for calls in CALLS:
        progress(f"unrolled loop: {calls:,} calls per step, logs of ~{events:,} events")
        model = Sequence2()
        template = logtools.make_template(model, _step(model, calls // 3), folder)
        rows += _measure(template, events, repeats, folder, TOOLS)
    time_steps, steps = TSP
    progress(f"unrolled loop: the issue's log ({time_steps} time steps x {steps} steps)")
    model = Sequence2()
    template = logtools.make_template(model, _step(model, time_steps), folder)
    issue = _measure(template, template.events * steps, repeats, folder, TOOLS)
    return {"sizes": rows, "issue": issue}

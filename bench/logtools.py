"""Log sizes, realistic big logs, and the cost of ``hooktrace check`` / ``render`` on them.

Big logs are made from a real one: W2 (resnet18: residual branches, in-place ReLU, statistics
on) is traced for two steps and its second step is repeated with renumbered ``step``, ``seq``
and ``fwd`` until the log holds the requested number of events. Tracing 1e6 events for real
would take minutes; the copy has the same records, line lengths and mix of record types.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

import hooktrace
from hooktrace.log import schema

_ONE_OFF = ("header", "model", "module", "tensors", "end")  # written once per log, not per step
_PARSE = (
    "import sys, orjson\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    for line in f:\n"
    "        orjson.loads(line)\n"
)
_RUSAGE = (  # argv[1:] -> [exit status, CPU s, wall s, peak RSS kB] of that command alone
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "status = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "wall = time.perf_counter() - start\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print([status, usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss])\n"
)
TOOLS = ("parse", "check", "render")


@dataclass
class LogSummary:
    """Sizes of one log; the step/event counts come from its end record."""

    events: int
    steps: int
    total_bytes: int
    step_bytes: int  # records written every step: events, params, step, anomaly
    event_bytes: int  # event records alone
    zoomed: int = 0  # ops records: the zoomed calls


def summarize_log(path: Path) -> LogSummary:
    total = step_bytes = event_bytes = zoomed = 0
    end: dict[str, Any] | None = None
    with path.open("rb") as f:
        for line in f:
            record = orjson.loads(line)
            total += len(line)
            kind = record.get("type")
            if kind == "end":
                end = record
            if kind not in _ONE_OFF:
                step_bytes += len(line)
            if kind in ("forward", "backward"):
                event_bytes += len(line)
            zoomed += kind == "ops"
    if end is None:
        raise RuntimeError(f"{path} has no end record: the session did not close")
    return LogSummary(end["events"], end["steps"], total, step_bytes, event_bytes, zoomed)


@dataclass
class Template:
    head: list[bytes]  # header, model and module lines, as hooktrace wrote them
    step: list[dict[str, Any]]  # the records of one whole step, in file order
    events: int  # event records in ``step``
    first_seq: int


def make_template(model: Any, step: Any, folder: Path) -> Template:
    """Trace two steps of a workload; keep the second, steady-state step as the pattern."""
    log = folder / "template.jsonl"
    with hooktrace.trace(log, model=model, steps="all"):
        step()
        step()
    head: list[bytes] = []
    records: list[dict[str, Any]] = []
    for line in log.read_bytes().splitlines():
        record = orjson.loads(line)
        if record["type"] in ("header", "model", "module", "tensors"):
            head.append(line)
        elif record["type"] != "end" and record.get("step") == 1:
            records.append(record)
    log.unlink()
    seqs = [r["seq"] for r in records if r["type"] in ("forward", "backward")]
    return Template(head, records, len(seqs), min(seqs))


def write_log(template: Template, events: int, path: Path) -> int:
    """Write a log of at least ``events`` events (whole steps); return how many it holds."""
    steps = max(1, math.ceil(events / template.events))
    with path.open("wb") as f:
        for line in template.head:
            f.write(line + b"\n")
        for k in range(steps):
            shift = k * template.events - template.first_seq + 1
            for record in template.step:
                copy = dict(record, step=k)
                if "seq" in copy:
                    copy["seq"] += shift
                if copy.get("fwd", -1) >= 0:
                    copy["fwd"] += shift
                f.write(orjson.dumps(copy) + b"\n")
        end = schema.End("ok", events=steps * template.events, steps=steps)
        f.write(orjson.dumps(end.to_dict()) + b"\n")
    return steps * template.events


@dataclass
class ToolRun:
    cpu: float  # user + system seconds of the child process
    wall: float
    peak_mb: float  # maximum resident set size


def _argv(tool: str, log: Path, folder: Path) -> list[str]:
    if tool == "parse":
        return [sys.executable, "-c", _PARSE, str(log)]
    if tool == "check":
        return [sys.executable, "-m", "hooktrace", "check", str(log)]
    return [sys.executable, "-m", "hooktrace", "render", str(log), "--format", "dot",
            "-o", str(folder / "render.dot")]


def run_child(argv: Sequence[str], ok: tuple[int, ...] = (0,)) -> ToolRun:
    """Run a command under a small Python helper that reports its rusage.

    Not wait4 on our own child: Linux carries the RSS peak of the forking process over into
    the child's ``ru_maxrss`` (through fork and exec), and this process holds the models."""
    with tempfile.TemporaryFile() as err:
        done = subprocess.run([sys.executable, "-c", _RUSAGE, *argv], stdout=subprocess.PIPE,
                              stderr=err, check=True)
        status, cpu, wall, peak_kb = orjson.loads(done.stdout)
        if status not in ok:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(argv[:5])} exited {status}:\n{tail}")
    return ToolRun(cpu, wall, peak_kb / 1024)


def measure_tools(template: Template, sizes: Sequence[int], repeats: int,
                  folder: Path) -> list[dict[str, Any]]:
    """Per log size and tool: median CPU and wall seconds, peak memory, ratio to the parse.

    The three tools alternate within each repetition, so they see the same machine load; the
    file stays in the page cache for all of them."""
    rows: list[dict[str, Any]] = []
    for size in sizes:
        log = folder / f"generated-{size}.jsonl"
        events = write_log(template, size, log)
        runs: dict[str, list[ToolRun]] = {tool: [] for tool in TOOLS}
        for _ in range(repeats):
            for tool in TOOLS:
                ok = (0, 1) if tool == "check" else (0,)  # check: 1 = it found problems
                runs[tool].append(run_child(_argv(tool, log, folder), ok))
        parse_cpu = statistics.median(r.cpu for r in runs["parse"])
        for tool in TOOLS:
            cpu = statistics.median(r.cpu for r in runs[tool])
            rows.append({
                "events": events, "file_mb": log.stat().st_size / 2**20, "tool": tool,
                "cpu_s": cpu, "wall_s": statistics.median(r.wall for r in runs[tool]),
                "peak_mb": max(r.peak_mb for r in runs[tool]), "x_parse": cpu / parse_cpu,
                "repeats": repeats,
            })
        log.unlink()
        (folder / "render.dot").unlink(missing_ok=True)
    return rows

"""Each recorded call's time (``observe/timing.py``, the ``call-times`` signal) on a real
torchvision resnet18 traced by ``hooktrace run``: the calls' own times add up to the forward the
script timed around the model's call, a module made slow on purpose tops ``show --sort time``,
and ``export --format trace`` is a Trace Event Format file whose spans nest, forward before
backward. No viewer runs offline here (Perfetto's trace processor downloads its binary), so the
file's invariants are checked as a viewer reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, Shared, hooktrace_cmd

from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.log.timing import times_by_seq

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "tests" / "scripts" / "timed_train.py"


def traced(shared: Shared, model: str = "resnet18") -> Path:
    def make(folder: Path) -> str:
        run = hooktrace_cmd("run", "--time", "-o", folder / "run.jsonl", SCRIPT,
                            folder / "measured.json", model, cwd=folder, timeout=600)
        assert run.returncode == 0, run.stderr
        return str(folder)
    return Path(shared(f"timed_{model}", make))


@pytest.mark.parametrize("model", ["resnet18", "transformer"])
def test_own_times_add_up_to_the_measured_forward(shared: Shared, model: str) -> None:
    folder = traced(shared, model)
    measured = json.loads((folder / "measured.json").read_text())["forward_us"]
    records = list(LogReader(folder / "run.jsonl"))
    times = times_by_seq(records)
    roots = [r for r in records if isinstance(r, schema.ForwardEvent) and r.fqn == ""]
    assert [r.step for r in roots] == [0, 0, 1, 2]  # the script's no_grad call, then training
    calls = sum(isinstance(r, schema.ForwardEvent) and r.step == 2 for r in records)
    for step, wanted in enumerate(measured):
        root = [r for r in roots if r.step == step][-1]
        inside = [t for t in times.values() if t.step == step
                  and times[root.seq].start <= t.start and t.seq <= root.seq]
        assert len(inside) == calls
        assert sum(t.own for t in inside) == pytest.approx(times[root.seq].forward,
                                                           abs=0.5 * len(inside))  # rounded to 1 us
        assert sum(t.own for t in inside) == pytest.approx(wanted, rel=0.10)
        assert all(t.backward is not None and t.backward > 0 for t in inside)


def test_a_module_made_slow_tops_show_sort_time(shared: Shared) -> None:
    folder = traced(shared)
    for step in ("0", "2"):
        shown = hooktrace_cmd("show", "--sort", "time", "--step", step, "--limit", "3",
                              folder / "run.jsonl")
        assert shown.returncode == 0, shown.stderr
        rows = shown.stdout.splitlines()
        assert rows[2].split()[:2] == ["own", "ms"]
        assert rows[3].split()[-2:] == ["layer2.1.conv1", "Slow"], shown.stdout
        assert float(rows[3].split()[0]) > 2 * float(rows[4].split()[0])


def spans(trace: dict[str, Any], tid: int) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == tid]


def test_the_trace_nests_forward_before_backward(shared: Shared) -> None:
    folder = traced(shared)
    out = folder / "run.trace.json"
    exported = hooktrace_cmd("export", "--format", "trace", folder / "run.jsonl", cwd=folder)
    assert exported.returncode == 0, exported.stderr
    trace = json.loads(out.read_text())
    assert out.stat().st_size < 400 * len(trace["traceEvents"])  # 10,000 calls: a few MB
    forward, backward = spans(trace, 0), spans(trace, 1)
    calls = sum(e["args"]["step"] == 2 for e in forward)  # a step's calls: one model call
    assert len(forward) == calls * 4 and len(backward) == calls * 3
    names = {(e["name"], e["args"]["name"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    assert ("thread_name", "model forward") in names and ("thread_name", "model backward") in names
    by_seq = {e["args"]["seq"]: e for e in forward}
    for e in forward:  # each call inside its parent's call: the parent is the next call of its
        fqn = e["name"]  # parent's fqn to return after it
        if fqn == "(root)":
            continue
        parent = fqn.rpartition(".")[0] or "(root)"
        outer = min((p for p in forward if p["name"] == parent and p["args"]["seq"] > e["args"]
                     ["seq"]), key=lambda p: p["args"]["seq"])
        assert outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1
    for b in backward:
        f = by_seq[b["args"]["forward_seq"]]
        assert f["ts"] + f["dur"] <= b["ts"], (f, b)
        assert b["args"]["grad_output_norm"] is not None
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    steps = [e for e in instants if e["name"] == "SGD.step()"]
    assert [e["args"]["after_step"] for e in steps] == [0, 1, 2]
    for e, step in zip(steps, (0, 1, 2), strict=True):  # after that step's last backward
        last = max(b["ts"] + b["dur"] for b in backward if b["args"]["step"] == step)
        assert e["ts"] >= last - 1  # each time rounded to 1 us

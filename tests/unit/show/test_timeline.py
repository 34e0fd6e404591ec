"""``export --format trace`` (``show/timeline.py``) and ``show --sort time`` on the checked-in
logs: every recorded call a span on its model's thread, nested inside its caller's, forward
before backward; a log without the ``call-times`` signal (the bug sets') gives no span and a
one-line error from ``show --sort time``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.show.render.times import by_time
from hooktrace.show.timeline import write_trace
from unit.logs import LOGS


def trace(name: str) -> dict[str, Any]:
    out = io.StringIO()
    write_trace(out, [LogReader(LOGS / f"{name}.jsonl")])
    return dict(json.loads(out.getvalue()))


@pytest.mark.parametrize("name", ["mnist", "gan", "vae", "eval_mode"])
def test_every_recorded_call_is_a_span_nested_in_its_thread(name: str) -> None:
    events = trace(name)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    forwards = [r for r in LogReader(LOGS / f"{name}.jsonl")
                if isinstance(r, schema.ForwardEvent)]
    assert sorted(e["args"]["seq"] for e in spans if e["tid"] % 2 == 0) == [
        f.seq for f in forwards]
    open_ends: list[tuple[int, float]] = []
    for e in spans:  # sorted by thread and start: each ends inside the span it starts in
        while open_ends and (open_ends[-1][0] != e["tid"] or e["ts"] >= open_ends[-1][1]):
            open_ends.pop()
        assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1][1] + 1e-6
        open_ends.append((e["tid"], e["ts"] + e["dur"]))
    by_seq = {e["args"]["seq"]: e for e in spans if e["tid"] % 2 == 0}
    for b in (e for e in spans if e["tid"] % 2):
        f = by_seq[b["args"]["forward_seq"]]
        assert b["tid"] == f["tid"] + 1 and f["ts"] + f["dur"] <= b["ts"]


def test_two_models_two_tracks_and_the_optimizers_steps() -> None:
    events = trace("gan")["traceEvents"]
    threads = sorted(e["args"]["name"] for e in events if e["name"] == "thread_name")
    assert threads == [f"{model} {phase}" for model in ("criterion", "discriminator",
                                                         "generator")
                       for phase in ("backward", "forward")]
    assert any(e["ph"] == "i" and e["name"] == "Adam.step()" for e in events)


def test_findings_are_instants_at_their_module() -> None:
    events = trace("nan_layer")["traceEvents"]
    found = [e for e in events if e["ph"] == "i" and ":" in e["name"]]
    assert found and all(e["args"]["message"] for e in found)


def test_a_log_without_call_times(tmp_path: Path) -> None:
    lines = (LOGS / "mnist.jsonl").read_bytes().splitlines(keepends=True)
    old = tmp_path / "old.jsonl"  # as a log from before the signal
    old.write_bytes(b"".join(line for line in lines if b'"call-times"' not in line))
    with pytest.raises(HooktraceError, match="no call times: trace it with hooktrace run --time"):
        write_trace(io.StringIO(), [LogReader(old)])
    with pytest.raises(HooktraceError, match="no call times"):
        by_time(old)


def test_show_sort_time_puts_the_longest_own_time_first() -> None:
    text = by_time(LOGS / "mnist.jsonl", step=1).text
    rows = [line.split() for line in text.splitlines()[3:] if line.strip()]
    own = [float(r[0]) for r in rows]
    assert own == sorted(own, reverse=True) and len(own) == 7

"""Crash safety: a full disk stops tracing (or, with --strict, stops the script), DataLoader
workers never write into the log."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, SAMPLES, events, read_log

from hooktrace.log import schema
from hooktrace.log.reader import LogReader

LIMIT = 8_000  # bytes a file may grow to in the "disk full" runs


def _small_disk() -> None:
    # a file-size limit makes writes past LIMIT fail with EFBIG, as a full disk fails them
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _run_on_small_disk(log: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", "run", "-o", str(log), *options,
         str(SAMPLES / "mnist_net.py"), "--steps", "6"],
        preexec_fn=_small_disk, capture_output=True, text=True, timeout=300)


def test_disk_full_stops_tracing_and_the_script_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = _run_on_small_disk(log)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("loss") == 6  # all six steps ran
    assert (f"hooktrace: cannot write the log {log}: File too large; tracing stopped "
            "(your script goes on)") in result.stderr
    assert "Traceback" not in result.stderr
    assert "tracing stopped early" in result.stderr.splitlines()[-2]
    reader = LogReader(log)
    records = list(reader)  # valid up to its last whole line
    assert records and reader.end is None
    assert log.stat().st_size <= LIMIT


def test_disk_full_with_strict_stops_the_script(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = _run_on_small_disk(log, "--strict")
    assert result.returncode == 1
    assert result.stdout.count("loss") < 6
    assert "LogWriteError: cannot write the log" in result.stderr


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_never_write_into_the_log(tmp_path: Path, context: str) -> None:
    log = tmp_path / "log.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "hooktrace", "run", "-o", str(log),
         str(ROOT / "tests" / "scripts" / "loader_train.py"), context],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    records = read_log(log)  # every line parses
    header = records[0]
    assert isinstance(header, schema.Header)
    # only the main process wrote: the main model's 8 batches, nothing from the transform that
    # the workers called
    assert {r.pid for r in records if isinstance(r, schema.Header)} == {header.pid}
    forward = events(log, "forward")
    assert {e.fqn for e in forward} == {"", "0", "1", "2"}
    assert len(forward) == 8 * 4
    assert isinstance(records[-1], schema.End) and records[-1].steps == 8

"""Fixtures every tier shares; the helpers themselves live in ``helpers.py``."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Shared, Traced, hooktrace_cmd


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n`` each test process, and every run it starts, computes with one
    intra-op thread: one process per core already fills the cores, and two spinning OpenMP
    threads per process on a shared 2-core machine made steps up to 13x slower (measured with
    densenet121 in the healthy sweep)."""
    if hasattr(config, "workerinput"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """With ``HOOKTRACE_TEST_TIMELINE=FILE``, each test's process, start and end (wall clock,
    setup to teardown) appended to FILE as a JSON line: ``python tests/timeline.py FILE`` says
    where a run's time went (how busy each process was, what ran last)."""
    timeline = os.environ.get("HOOKTRACE_TEST_TIMELINE")
    start = time.time()
    try:
        return (yield)
    finally:
        if timeline:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            line = json.dumps([worker, item.nodeid, start, time.time()]) + "\n"
            with open(timeline, "a") as out:  # one short write: lines of processes never mix
                out.write(line)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "trace.jsonl"


@pytest.fixture(scope="session")
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """``shared(name, make)``: what ``make(folder)`` returns (JSON), made once per test run in
    ``folder``, its own. The test processes of one ``pytest -n`` run share it through the folder
    and a lock: the first to ask makes it, the others wait and read it."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if hasattr(request.config, "workerinput") else base

    def once(name: str, make: Callable[[Path], Any]) -> Any:
        folder = root / "shared" / name
        folder.mkdir(parents=True, exist_ok=True)
        made = folder / ".made.json"
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not made.exists():
                made.write_text(json.dumps(make(folder)))
        return json.loads(made.read_text())

    return once


@pytest.fixture(scope="session")
def traced(shared: Shared) -> Traced:
    """A real ``hooktrace run`` of a script, made once per test run (``shared``): every test
    that asks for the same script, arguments, options and folder reads the same log (read it,
    never change it; what the script printed is beside it, ``LOG.stdout``; ``status``: the exit
    status the run must end with)."""
    def trace(script: str | os.PathLike[str], *args: str, options: tuple[str, ...] = (),
              cwd: str | os.PathLike[str] | None = None, status: int = 0) -> Path:
        key = "\0".join([os.fspath(script), *args, "--", *options, os.fspath(cwd or "")])
        name = f"{Path(script).stem}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"

        def run(folder: Path) -> str:
            log = folder / f"{name}.jsonl"
            result = hooktrace_cmd("run", "-o", log, *options, script, *args, cwd=cwd)
            assert result.returncode == status, result.stderr
            log.with_suffix(".stdout").write_text(result.stdout)
            return str(log)

        return Path(shared(f"traced/{name}", run))

    return trace


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (``--dist worksteal``, pyproject.toml), the tests in the order that
    keeps both test processes busy to the end.

    worksteal hands the first half of the tests to one process and the second half to the
    other; a process out of work takes the last half of the other's queue. So each half is laid
    out heaviest first: the tests that make real runs (the ``shared`` fixture: bug sets,
    compiled runs), then the other torch tests, then the unit tier, which ends both halves and
    is what gets taken. A module stays in one half (its module fixtures are made once)."""
    if not hasattr(config, "workerinput"):  # one process: the order of the files
        return
    halves: list[list[pytest.Item]] = [[], []]
    for weight in ("runs", "torch"):
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            if _weight(item) == weight:
                modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        for tests in modules.values():  # each module into the half with fewer tests so far
            min(halves, key=len).extend(tests)
    light = [item for item in items if _weight(item) == "unit"]
    first = max(0, (len(items) + 1) // 2 - len(halves[0]))  # the first half: exactly half
    items[:] = halves[0] + light[:first] + halves[1] + light[first:]


def _weight(item: pytest.Item) -> str:
    """``runs``: makes or reads real runs; ``unit``: the unit tier and the layout's rules;
    ``torch``: the rest."""
    if item.nodeid.startswith(("tests/unit/", "tests/project/", "unit/", "project/")):
        return "unit"
    return "runs" if "shared" in getattr(item, "fixturenames", ()) else "torch"


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


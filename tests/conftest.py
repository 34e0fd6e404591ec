"""Fixtures every tier shares; the helpers themselves live in ``helpers.py``."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest
from helpers import Traced, hooktrace_cmd


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n`` each test process, and every run it starts, computes with one
    intra-op thread: one process per core already fills the cores, and two spinning OpenMP
    threads per process on a shared 2-core machine made steps up to 13x slower (measured with
    densenet121 in the healthy sweep)."""
    if hasattr(config, "workerinput"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "trace.jsonl"


@pytest.fixture(scope="session")
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """A real ``hooktrace run`` of a script, made once per test run: every test that asks for
    the same script, arguments, options and folder reads the same log (read it, never change
    it; what the script printed is beside it, ``LOG.stdout``; ``status``: the exit status the
    run must end with). The test processes of one
    ``pytest -n`` run share the logs through a folder and a lock.
    """
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if hasattr(request.config, "workerinput") else base) / "traced"
    folder.mkdir(exist_ok=True)

    def trace(script: str | os.PathLike[str], *args: str, options: tuple[str, ...] = (),
              cwd: str | os.PathLike[str] | None = None, status: int = 0) -> Path:
        key = "\0".join([os.fspath(script), *args, "--", *options, os.fspath(cwd or "")])
        name = f"{Path(script).stem}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
        log = folder / f"{name}.jsonl"
        with open(folder / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not log.with_suffix(".stdout").exists():
                result = hooktrace_cmd("run", "-o", log, *options, script, *args, cwd=cwd)
                assert result.returncode == status, result.stderr
                log.with_suffix(".stdout").write_text(result.stdout)
        return log

    return trace


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (``--dist loadgroup``), the tests of a module that makes its runs once
    in a module-scoped fixture go to one test process together, so the runs are made once; every
    other test goes wherever a process is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is not None and any(d.scope == "module" for defs in
                                    info.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

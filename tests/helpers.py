"""Shared helpers of the tests: read a log back, run the real ``hooktrace`` command."""

from __future__ import annotations

import ast
import atexit
import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hooktrace.log import schema
from hooktrace.log.reader import LogReader

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
GOLDEN = ROOT / "tests" / "golden"

#: the ``traced`` fixture (conftest.py): ``traced(script, *args, options=(...), cwd=...)`` is
#: the log of that real ``hooktrace run``, made once per test run
Traced = Callable[..., Path]
#: the ``shared`` fixture: ``shared(name, make)`` is ``make(folder)``'s JSON result, made once
#: per test run for every test process
Shared = Callable[[str, Callable[[Path], Any]], Any]


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
    return [e.fqn for e in events(path, phase, step)]


#: variables read while the command runs, not when torch is imported: a child takes them as
#: they are when it starts (pytest sets PYTEST_CURRENT_TEST for every test)
_RUN_TIME_ENV = ("PYTEST_", "HOOKTRACE_")


def _import_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_RUN_TIME_ENV)}


class _Forks:
    """The test process's client of ``forkserver.py``: one server, started on first use, runs
    each command in a forked child; callers in several threads share it."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._done: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._folder = Path()  # made with the server, removed with it

    def usable(self, env: Mapping[str, str]) -> bool:
        """Whether a forked child can see the environment ``env`` the command needs: the child takes
        the caller's environment, but torch read its own variables when the server imported
        it, so any other change since then needs a fresh process."""
        if os.environ.get("HOOKTRACE_TEST_NO_FORK") == "1":
            return False
        return self._server is None or _import_env(env) == _import_env(self._env)

    def _start(self) -> subprocess.Popen[bytes]:
        if self._server is None:
            self._env = dict(os.environ)
            self._folder = Path(tempfile.mkdtemp(prefix="hooktrace-forks-"))
            self._server = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("forkserver.py"))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            threading.Thread(target=self._read, args=(self._server,), daemon=True).start()
            atexit.register(self.close)
        return self._server

    def _read(self, server: subprocess.Popen[bytes]) -> None:
        assert server.stdout is not None
        for line in server.stdout:
            reply = json.loads(line)
            with self._lock:
                self._done.pop(reply["id"]).put(reply)

    def run(self, argv: list[str], cwd: str | os.PathLike[str] | None, timeout: float,
            env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        got: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        with self._lock:
            server = self._start()
            job_id = next(self._ids)
            out, err = (self._folder / f"{job_id}.{n}" for n in ("out", "err"))
            self._done[job_id] = got
            job = {"id": job_id, "argv": argv, "cwd": os.fspath(cwd or os.getcwd()),
                   "env": dict(env), "stdout": str(out), "stderr": str(err),
                   "timeout": timeout}
            assert server.stdin is not None
            server.stdin.write(json.dumps(job).encode() + b"\n")
            server.stdin.flush()
        reply = got.get(timeout=timeout + 60)
        stdout, stderr = (p.read_text(errors="replace") for p in (out, err))
        out.unlink()
        err.unlink()
        command = [sys.executable, "-m", "hooktrace", *argv]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)

    def close(self) -> None:
        if self._server is not None and self._server.stdin is not None:
            self._server.stdin.close()
            self._server.wait(timeout=60)
            shutil.rmtree(self._folder, ignore_errors=True)


_FORKS = _Forks()


def hooktrace_cmd(*args: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
                  timeout: float = 300, fresh: bool = False, **kwargs: object
                  ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hooktrace ARGS`` for real and capture its output.

    The command runs in a process of its own: a child forked from a server that imported torch
    once (``forkserver.py``), unless ``fresh`` (a new interpreter, for what tests the
    interpreter's own start and end), other keyword arguments for ``subprocess.run`` than
    ``env`` (``input``) are given, or a variable torch reads at import differs from the
    server's.
    """
    argv = list(map(str, args))
    if kwargs.get("env", os.environ) is None:  # subprocess's default: this process's
        del kwargs["env"]
    env = kwargs.get("env", os.environ)
    assert isinstance(env, Mapping)
    if not fresh and set(kwargs) <= {"env"} and _FORKS.usable(env):
        return _FORKS.run(argv, cwd, timeout, env)
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", *argv], cwd=cwd, capture_output=True,
        text=True, timeout=timeout, **kwargs,  # type: ignore[call-overload]
    )


def hooktrace_fresh(*args: str | os.PathLike[str], **kwargs: Any
                    ) -> subprocess.CompletedProcess[str]:
    """``python -m hooktrace ARGS`` in a new interpreter: for tests of what the interpreter's
    own start and end do (argv, sys.path, tracebacks, exit status, signals)."""
    return hooktrace_cmd(*args, fresh=True, **kwargs)


#: a real ``hooktrace run`` of a case, and ``hooktrace check --json`` of its log
Run = tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]


class Cases(dict[str, Run]):
    """The runs of ``run_cases`` by case; ``folder`` holds their logs (``CASE.jsonl``)."""

    def __init__(self, folder: Path, runs: Mapping[str, Run]) -> None:
        super().__init__(runs)
        self.folder = folder


def run_cases(shared: Shared, name: str, cases: Sequence[str],
              script: Callable[[str], Path], options: Sequence[str] = ()) -> Cases:
    """Each case traced (``hooktrace run OPTIONS -o FOLDER/CASE.jsonl SCRIPT CASE``,
    ``script(case)`` says which script) and checked (``check --json``) once per test run,
    whichever test process asks first (``shared`` under ``cases/NAME``), two at a time: each
    run is mostly torch's import."""
    def run(folder: Path, case: str) -> list[list[Any]]:
        log = folder / f"{case}.jsonl"
        done = (hooktrace_cmd("run", *options, "-o", log, script(case), case),
                hooktrace_cmd("check", "--json", log))
        return [[list(map(str, r.args)), r.returncode, r.stdout, r.stderr] for r in done]

    def make(folder: Path) -> dict[str, Any]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = pool.map(lambda case: run(folder, case), cases)
            return {"folder": str(folder), "runs": dict(zip(cases, runs, strict=True))}

    made = shared(f"cases/{name}", make)
    return Cases(Path(made["folder"]), {
        case: (subprocess.CompletedProcess(*traced), subprocess.CompletedProcess(*checked))
        for case, (traced, checked) in made["runs"].items()})


def run_findings(run: Run) -> tuple[int, list[dict[str, Any]]]:
    """check's exit status and findings, once the run and the check both ended as they may."""
    traced, check = run
    assert traced.returncode == 0, traced.stderr
    assert check.returncode in (0, 1), check.stderr
    return check.returncode, json.loads(check.stdout)["findings"]


def problems(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(kind, severity, model, module, step) of each finding that is not a note, in order."""
    return [(f["cause"], f["severity"], f["model"], f["module"], f["step"]) for f in found
            if f["severity"] != "note"]


def run_sample(log: Path, script: str, *args: str) -> None:
    """Trace a sample script the way ``hooktrace run`` does, in this process."""
    import runpy

    import hooktrace

    argv = sys.argv
    sys.argv = [script, *args]
    try:
        with hooktrace.trace(log):
            runpy.run_path(str(SAMPLES / script), run_name="__main__")
    finally:
        sys.argv = argv


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


def script_cases(script: Path) -> list[str]:
    """The names in a bug script's ``BUGS`` and ``HEALTHY`` tuples, read without importing
    torch (a blind set's scorecard must hold every case of its script)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    return [elt.id for node in tree.body if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name) and node.target.id in ("BUGS", "HEALTHY")
            and isinstance(node.value, ast.Tuple)
            for elt in node.value.elts if isinstance(elt, ast.Name)]

"""Runs ``hooktrace`` commands in forked children of one process that imported torch once.

A traced run spends most of its time importing torch (3-5 s of CPU here). This process imports
``hooktrace.cli`` and the tracer (and so torch) once, then for each job forks a child that does
what ``python -m hooktrace ARGS`` does from that point on: it takes the job's environment
(the caller's; ``helpers.py`` starts a fresh interpreter instead when a variable torch reads at
import changed since the server started), changes into the job's folder,
reads no stdin, writes its stdout and stderr to the job's files, calls the real CLI with the
job's arguments and exits with its status, after the interpreter's exit functions ran. So each
command still runs in a process of its own, from the state a fresh ``hooktrace run`` has once it
imported torch; only the import is shared. ``tests/helpers.py`` starts one per test process.

Protocol, one JSON object per line: in ``{"id", "argv", "cwd", "env", "stdout", "stderr",
"timeout"}``, out ``{"id", "returncode", "timed_out"}`` (a negative status: killed by that
signal, as in subprocess; a child past its timeout is killed with SIGKILL).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import Any

import hooktrace.cli
import hooktrace.tracing.runner


def _child(job: dict[str, Any]) -> None:
    """In the forked child: run the command and exit with its status; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.argv = ["hooktrace", *job["argv"]]
        try:
            hooktrace.cli.cli.main(args=job["argv"], prog_name="hooktrace")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing left to write
                stream.flush()
        os._exit(code)


def _status(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve() -> None:
    children: dict[int, tuple[str, float]] = {}  # pid -> (job id, deadline)
    stdin, pending = sys.stdin.buffer, b""
    open_input = True
    while open_input or children:
        if open_input and select.select([stdin], [], [], 0.02)[0]:
            chunk = os.read(stdin.fileno(), 1 << 16)
            open_input = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in filter(None, lines):
                job = json.loads(line)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(job)
                children[pid] = (job["id"], time.monotonic() + job["timeout"])
        elif not open_input:
            time.sleep(0.02)
        for pid, (job_id, deadline) in list(children.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            timed_out = not done and time.monotonic() > deadline
            if timed_out:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
            if done:
                del children[pid]
                print(json.dumps({"id": job_id, "returncode": _status(status),
                                  "timed_out": timed_out}), flush=True)


if __name__ == "__main__":
    serve()

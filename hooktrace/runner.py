"""``hooktrace run``: run an unmodified script (or ``-m module``) as python would, traced.

The script sees what ``python SCRIPT ARGS`` gives it: ``__name__ == "__main__"``, ``sys.argv``,
its folder first on ``sys.path``. Its output, traceback and exit status pass through unchanged:
an uncaught exception prints python's traceback (hooktrace's frames trimmed) and exits 1,
``sys.exit(n)`` exits n, Ctrl-C ends the process by SIGINT and SIGTERM by SIGTERM, as python's do.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import runpy
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from hooktrace.api import Trace
from hooktrace.errors import HooktraceError
from hooktrace.options import TraceOptions

_RUNNER_FILES = (str(Path(__file__).parent), str(Path(runpy.__file__).with_suffix("")))


@dataclass
class Target:
    name: str  # script path, or module name with as_module
    args: Sequence[str]
    as_module: bool = False


def _check_target(target: Target, output: Path) -> None:
    if target.as_module:
        try:
            found = importlib.util.find_spec(target.name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise HooktraceError(f"no module named {target.name}")
        return
    path = Path(target.name)
    if not path.exists():
        raise HooktraceError(f"no such script: {target.name}")
    if path.is_dir() and not (path / "__main__.py").exists():
        raise HooktraceError(f"{target.name} is a directory with no __main__.py")
    if output.exists() and path.resolve() == output.resolve():
        raise HooktraceError(f"the log would overwrite the script {target.name}; choose another -o")


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the leading frames of hooktrace and runpy: the traceback python itself would print."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNNER_FILES):
        tb = tb.tb_next
    return tb


def _exec(target: Target) -> None:
    if target.as_module:
        sys.argv = [target.name, *target.args]  # run_module puts the module's file in argv[0]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target.name, *target.args]
        sys.path.insert(0, os.path.dirname(os.path.realpath(target.name)))
        runpy.run_path(target.name, run_name="__main__")


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): python prints it and exits 1
    return 1


def _summary(session: Trace) -> None:
    end = session.end
    if end is None:
        return
    dropped = f", {end.dropped} calls past --max-events not recorded" if end.dropped else ""
    print(f"hooktrace: {end.events} events, {end.steps} steps{dropped} -> {session.path}\n"
          f"hooktrace: next: hooktrace show {session.path}", file=sys.stderr)


def _die_by(signum: int) -> None:
    """End the process by ``signum`` with its default action, as python does on Ctrl-C."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run(target: Target, output: Path, options: TraceOptions) -> int:
    """Run ``target`` traced; return its exit status (Ctrl-C / SIGTERM end the process)."""
    _check_target(target, output)
    session = Trace(output, None, options, argv=[target.name, *target.args])
    session.start()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        session.stop("interrupted", exit_code=-signum)
        _summary(session)
        _die_by(signum)

    sigterm_installed = False
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
        sigterm_installed = True
    try:
        _exec(target)
    except SystemExit as e:
        code = _exit_code(e.code)
        session.stop("ok" if code == 0 else "error", None if code == 0 else e, exit_code=code)
    except KeyboardInterrupt as e:
        sys.excepthook(type(e), e, _user_traceback(e.__traceback__))
        session.stop("interrupted", e, exit_code=-signal.SIGINT)
        _summary(session)
        atexit._run_exitfuncs()
        _die_by(signal.SIGINT)
        return 130  # not reached: the signal ends the process
    except BaseException as e:
        sys.excepthook(type(e), e, _user_traceback(e.__traceback__))
        session.stop("error", e, exit_code=1)
    else:
        session.stop("ok", exit_code=0)
    finally:
        if sigterm_installed and signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _summary(session)
    assert session.end is not None and session.end.exit_code is not None
    return session.end.exit_code

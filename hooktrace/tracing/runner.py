"""``hooktrace run``: run an unmodified script (or ``-m module``) as python would, traced.

The script sees what ``python SCRIPT ARGS`` gives it: ``__name__ == "__main__"``, ``sys.argv``,
its folder first on ``sys.path``. Its output, traceback and exit status pass through unchanged:
an uncaught exception prints python's traceback (hooktrace's frames trimmed) and exits 1 (one
line where ``--break-on nan`` stopped it without a terminal), ``sys.exit(n)`` exits n, Ctrl-C
ends the process by SIGINT and SIGTERM by SIGTERM, as python's do.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib.machinery
import os
import runpy
import signal
import sys
import types
from pathlib import Path
from types import FrameType

from hooktrace.log import schema
from hooktrace.log.errors import NonFiniteError
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import EndStatus
from hooktrace.log.unseen import nothing_seen
from hooktrace.log.words import plural
from hooktrace.log.writer import capture_dir
from hooktrace.tracing.api import Trace
from hooktrace.tracing.target import Target, check_target, set_path

__all__ = ["Target", "run"]

# frames of hooktrace (the package, above tracing/) and runpy ("<frozen runpy>" where runpy is
# frozen): python shows none
_RUNNER_FILES = (str(Path(__file__).parent.parent), str(Path(runpy.__file__).with_suffix("")),
                 "<frozen runpy>")


def _print_exception(e: BaseException) -> None:
    """Print ``e`` as python would: without the leading frames of hooktrace and runpy, nor
    hooktrace's anywhere below (its wrappers of ``backward()``, which an error inside backward
    passes through)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNNER_FILES):
        tb = tb.tb_next
    kept = tb
    while kept is not None and kept.tb_next is not None:
        if kept.tb_next.tb_frame.f_code.co_filename.startswith(_RUNNER_FILES[0]):
            kept.tb_next = kept.tb_next.tb_next
        else:
            kept = kept.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)  # the hook prints e's own traceback


def _run_script(name: str) -> None:
    """Run a script file as python's main program: argv[0] as typed, an absolute __file__
    (python 3.9+), a fresh ``__main__`` module that stays (pickling, multiprocessing)."""
    path = os.path.abspath(name)
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _exec(target: Target) -> None:
    sys.argv = [target.name, *target.args]  # as typed; run_module puts the module's file there
    if target.as_module:
        runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    elif os.path.isdir(target.name):  # a folder with __main__.py, as python runs it
        runpy.run_path(target.name, run_name="__main__")
    else:
        _run_script(target.name)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): python prints it and exits 1
    return 1


def _summary(session: Trace, options: TraceOptions) -> None:
    end = session.end
    if end is None:
        return
    if session.kept_previous:
        return  # said by the session
    dropped = f", {end.dropped} more not written (--max-events)" if end.dropped else ""
    captured = (f", {plural(end.captured, 'tensor file')} in {capture_dir(session.path)}"
                if end.captured else "")
    stopped = " (tracing stopped early, see above)" if end.tracer_error else ""
    why = nothing_seen(options, end, session.models)
    then = (f"nothing traced: {why}" if why else
            f"next: hooktrace render {session.path}; hooktrace check {session.path}")
    print(f"hooktrace: {plural(end.events, 'event')}, {plural(end.steps, 'step')}{dropped}"
          f"{captured}{stopped} -> {session.path}\nhooktrace: {then}", file=sys.stderr)


def _die_by(signum: int) -> None:
    """End the process by ``signum`` with its default action, as python does on Ctrl-C."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run(target: Target, output: Path, options: TraceOptions) -> schema.End:
    """Run ``target`` traced; return the log's end record, with the script's exit status and
    the error it raised (Ctrl-C / SIGTERM end the process)."""
    set_path(target)  # again: a caller other than the command may not have
    check_target(target, output)
    session = Trace(output, None, options, argv=[target.name, *target.args])
    session.start()
    # What is alive now (torch and hooktrace, imported; the script has not run) lives for the
    # whole run: frozen, the garbage collector stops rescanning it. Objects the tracer keeps for
    # a step set off full collections (0.1-0.3 s each with torch loaded); frozen, they are short.
    gc.freeze()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        session.stop(EndStatus.INTERRUPTED, exit_code=-signum)
        _summary(session, options)
        _die_by(signum)

    sigterm_installed = False
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
        sigterm_installed = True
    try:
        _exec(target)
    except SystemExit as e:
        code = _exit_code(e.code)
        session.stop(EndStatus.OK if code == 0 else EndStatus.ERROR, None if code == 0 else e,
                     exit_code=code)
    except KeyboardInterrupt as e:
        _print_exception(e)
        session.stop(EndStatus.INTERRUPTED, e, exit_code=-signal.SIGINT)
        _summary(session, options)
        atexit._run_exitfuncs()
        _die_by(signal.SIGINT)
        assert session.end is not None
        return session.end  # not reached: the signal ends the process
    except NonFiniteError as e:  # --break-on nan without pdb: its line says what and where
        print(e, file=sys.stderr)
        session.stop(EndStatus.ERROR, e, exit_code=1)
    except BaseException as e:
        _print_exception(e)
        session.stop(EndStatus.ERROR, e, exit_code=1)
    else:
        session.stop(EndStatus.OK, exit_code=0)
    finally:
        gc.unfreeze()
        if sigterm_installed and signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _summary(session, options)
    assert session.end is not None and session.end.exit_code is not None
    return session.end

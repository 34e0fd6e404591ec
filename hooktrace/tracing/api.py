"""``hooktrace.trace``: record a log from Python code (tests, notebooks, the ``run`` command)."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import torch
from torch import nn

from hooktrace.log import schema
from hooktrace.log.errors import LogWriteError
from hooktrace.log.options import DEFAULTS, TraceOptions
from hooktrace.log.schema import EndStatus
from hooktrace.log.version import __version__
from hooktrace.log.writer import LogWriter, rank_path
from hooktrace.observe.capture import Capture
from hooktrace.tracing.tracer import Tracer


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Trace:
    """A tracing session writing one log. Use as a context manager, or call start()/stop()."""

    def __init__(self, path: str | os.PathLike[str], models: Sequence[nn.Module] | None,
                 options: TraceOptions, argv: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self._options = options
        self._models = models
        self._argv = list(sys.argv if argv is None else argv)
        self._writer: LogWriter | None = None
        self._tracer: Tracer | None = None
        self._capture: Capture | None = None
        self.end: schema.End | None = None

    @property
    def events(self) -> int:
        return self._tracer.events if self._tracer else 0

    @property
    def models(self) -> int:
        return self._tracer.models if self._tracer else 0

    @property
    def steps(self) -> int:
        return self._tracer.steps if self._tracer else 0

    def start(self) -> Trace:
        if self._writer is not None:
            raise RuntimeError("this trace was started already; make a new hooktrace.trace()")
        rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        self.path = rank_path(self.path, rank, world_size)  # torchrun: no rank writes another's
        self._writer = LogWriter(self.path)  # an unwritable path fails here, before the run
        self._writer.write(schema.Header(
            schema=schema.SCHEMA_VERSION, hooktrace=__version__, torch=torch.__version__,
            python=platform.python_version(), argv=self._argv, pid=os.getpid(),
            rank=rank, local_rank=_env_int("LOCAL_RANK", 0),
            world_size=world_size, hostname=socket.gethostname(),
            started=round(time.time(), 3), options=self._options.to_header(), dataflow=True,
            eager=True, made_no_history=True,
        ))
        self._writer.flush()
        capture = (Capture(self.path, self._options.capture, self._options.capture_max_mb * 2**20)
                   if self._options.capture else None)
        self._tracer = Tracer(self._writer, self._options, self._models, capture).start()
        self._capture = capture
        return self

    def stop(self, status: str = EndStatus.OK, error: BaseException | None = None,
             exit_code: int | None = None) -> schema.End:
        """Remove the hooks and write the end record. A second call returns the first's record."""
        if self.end is not None:
            return self.end
        if self._tracer is None or self._writer is None:
            raise RuntimeError("this trace was never started")
        tracer = self._tracer
        try:
            tracer.stop()  # hooks are removed before anything is written
        except LogWriteError as e:
            self._write_failed(e)
        except Exception as e:  # an internal error: said once, never raised into the program
            tracer._fail(e)
        self.end = schema.End(
            status=status, events=tracer.events, steps=tracer.steps, exit_code=exit_code,
            error=tracer.describe(error) if error else None,
            dropped=tracer.dropped or None, tracer_error=tracer.error,
            captured=self._capture.files if self._capture else None,
            backward=tracer.backward_calls or None, compiled=tracer.compiled or None,
        )
        try:
            self._writer.write(self.end)
            self._writer.close()
        except LogWriteError as e:
            self._write_failed(e)
        if self._writer.kept_previous:
            print(f"hooktrace: this run recorded nothing: the log of an earlier run is kept at "
                  f"{self.path} (this run's empty log was dropped)", file=sys.stderr)
        elif self._capture:
            self._capture.prepare()  # no captures of an earlier run beside this run's log
        return self.end

    @property
    def kept_previous(self) -> bool:
        """The run recorded nothing, and the log with records that was at ``path`` is kept
        (this run's empty log is dropped)."""
        return self._writer is not None and self._writer.kept_previous

    def _write_failed(self, error: LogWriteError) -> None:
        """The log could not be finished: say so once, unless strict, where it is raised."""
        assert self._tracer is not None
        if self._options.strict:
            raise error
        if self._tracer.error is None:
            self._tracer.error = str(error)
            print(f"hooktrace: {error}; the log ends early", file=sys.stderr)

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        interrupted = isinstance(error, KeyboardInterrupt)
        self.stop(EndStatus.OK if error is None else
                  EndStatus.INTERRUPTED if interrupted else EndStatus.ERROR, error)


def trace(
    path: str | os.PathLike[str] = "hooktrace.jsonl",
    model: nn.Module | Sequence[nn.Module] | None = None,
    *,
    include: Sequence[str] = DEFAULTS.include,
    exclude: Sequence[str] = DEFAULTS.exclude,
    steps: str = DEFAULTS.steps.text,
    max_events: int = DEFAULTS.max_events,
    stats: bool = DEFAULTS.stats,
    watch: bool = DEFAULTS.watch,
    break_on: str | None = None,
    capture: Sequence[str] = DEFAULTS.capture,
    capture_max_mb: int = DEFAULTS.capture_max_mb,
    strict: bool = DEFAULTS.strict,
    ops: Sequence[str] = DEFAULTS.ops,
    probe: bool = DEFAULTS.probe,
    time: bool = DEFAULTS.time,
) -> Trace:
    """Trace every module call (or those of ``model`` only) into the JSONL log at ``path``.

    ``steps`` (default ``"0:10"``, or ``"all"``) are recorded in full; with ``watch``, later steps
    still write anomaly records (NaN/Inf, lost gradients). ``stats``: gradient norms and checks.
    ``ops``: fqn globs of the modules whose calls' tensor operations are recorded, each with
    its line (``--ops``). ``probe``: once per model, on a copy, whether one sample's output
    depends on another sample, and whether masks keep positions from later or padded ones
    (``--probe``). ``time``: each recorded call's forward and backward time (``--time``).

    >>> with hooktrace.trace("log.jsonl", model=net):
    ...     net(x).sum().backward()
    """
    models = [model] if isinstance(model, nn.Module) else (list(model) if model else None)
    options = TraceOptions.from_flags(
        include=include, exclude=exclude, steps=steps, max_events=max_events, stats=stats,
        watch=watch, break_on=break_on, capture=capture, capture_max_mb=capture_max_mb,
        strict=strict, ops=ops, probe=probe, time=time, run=None)
    return Trace(path, models, options)

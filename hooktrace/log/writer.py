"""Writing logs: a line-atomic writer that never loses the previous log to a run that records
nothing.

The writer emits whole lines only and is flushed by the tracer at least once per step, so a log
cut off by kill -9 is valid up to its last whole line. A forked child (a DataLoader worker) never
writes its parent's buffer twice. Where a log with records is in the way, the new log is written
beside it and moved over it when its first record after the header comes (the open file
survives the rename), so a run killed later still leaves its own partial log, and a run that
records nothing leaves the previous log where it was. Lines are written with orjson (about five
times faster than json per event).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import IO, Any

import orjson

from hooktrace.log import schema, wire
from hooktrace.log.errors import LogError, LogWriteError
from hooktrace.log.reader import has_records, is_hooktrace_log

_BUFFER_BYTES = 1 << 20

_open_writers: weakref.WeakSet[LogWriter] = weakref.WeakSet()


def _flush_before_fork() -> None:
    # A forked child inherits the buffer: flushing first leaves it nothing to write twice.
    for writer in list(_open_writers):
        writer.flush()


def _detach_in_child() -> None:
    for writer in list(_open_writers):
        writer.detach()


os.register_at_fork(before=_flush_before_fork, after_in_child=_detach_in_child)


def rank_path(log: Path, rank: int, world_size: int) -> Path:
    """One log per process under a launcher: ``run.jsonl`` -> ``run.rank3.jsonl``."""
    if world_size <= 1:
        return log
    return log.with_name(f"{log.stem}.rank{rank}{log.suffix}")


def capture_dir(log: Path) -> Path:
    """Where ``--capture`` saves tensors for the log ``log``: ``run.jsonl`` -> ``run.capture/``."""
    return log.with_name(log.stem + ".capture")


class LogWriter:
    """Appends records as JSON lines to a new log at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise LogError(f"{self.path} is a directory; give a file name for the log")
        if self.path.exists() and not is_hooktrace_log(self.path):
            raise LogError(
                f"{self.path} exists and is not a hooktrace log; refusing to overwrite it"
            )
        self.kept_previous = False  # closed without a record: the previous log was kept
        self._pending: Path | None = None
        self._target = self.path.resolve() if self.path.is_symlink() else self.path
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] | None = self._open_beside() if has_records(self.path) \
                else self.path.open("wb", buffering=_BUFFER_BYTES)
        except OSError as e:
            raise LogError(self._cannot(e)) from None
        self._encoder = wire.Encoder()
        _open_writers.add(self)

    def _open_beside(self) -> IO[bytes]:
        """A log with records in the way: write beside it (hidden, no log's name) until the
        first record; where the folder takes no new file, over it as before."""
        pending = self._target.with_name(f".{self._target.name}.{os.getpid()}.new")
        try:
            f = pending.open("wb", buffering=_BUFFER_BYTES)
        except OSError:
            return self.path.open("wb", buffering=_BUFFER_BYTES)
        self._pending = pending
        return f

    def _move_over(self) -> None:
        """The first record after the header: the new log takes the previous one's place."""
        pending, self._pending = self._pending, None
        if pending is not None:
            os.replace(pending, self._target)  # a link to the log stays a link

    def write(self, record: Any) -> None:
        if self._file is not None:
            try:
                if self._pending is not None and not isinstance(record,
                                                                (schema.Header, schema.End)):
                    self._move_over()
                for d in self._encoder.wire(record):
                    self._file.write(orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE))
            except OSError as e:
                self._failed(e)

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as e:
                self._failed(e)

    def _failed(self, error: OSError) -> None:
        """Stop writing (the file stays valid up to its last whole line) and say why, once."""
        f, self._file = self._file, None
        try:
            if f is not None:
                f.close()
        except OSError:
            pass  # the buffer cannot go anywhere either
        raise LogWriteError(self._cannot(error)) from None

    def _cannot(self, error: OSError) -> str:
        return f"cannot write the log {self.path}: {error.strerror or error}"

    def detach(self) -> None:
        """Forget the file without writing (a forked child must not touch the parent's log)."""
        self._file = None
        self._pending = None

    def close(self) -> None:
        """Close the log; written beside a previous log and nothing recorded: dropped, and the
        previous log kept (``kept_previous``)."""
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except OSError as e:
                _open_writers.discard(self)
                raise LogWriteError(self._cannot(e)) from None
        _open_writers.discard(self)
        if self._pending is not None:
            self._pending.unlink(missing_ok=True)
            self._pending = None
            self.kept_previous = True

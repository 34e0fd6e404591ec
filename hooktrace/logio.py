"""Writing and reading logs: a line-atomic writer and a streaming, tolerant reader.

The writer emits whole lines only and is flushed by the tracer at least once per step, so a log
cut off by kill -9 is valid up to its last whole line. The reader streams (constant memory), turns
a partial last line or a missing end record into a warning, and refuses a log of a newer schema.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from hooktrace import schema
from hooktrace.errors import LogError, LogWriteError

MAX_LINE_BYTES = 16 * 1024 * 1024  # no record comes near this; a longer line is not a hooktrace log
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


def is_hooktrace_log(path: Path) -> bool:
    """True when the file's first line is a hooktrace header, or the file is empty."""
    try:
        if path.stat().st_size == 0:
            return True
        with path.open("rb") as f:
            first = f.readline(MAX_LINE_BYTES)
    except OSError:
        return False
    try:
        d = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(d, dict) and d.get("type") == "header"


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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] | None = self.path.open("wb", buffering=_BUFFER_BYTES)
        except OSError as e:
            raise LogError(f"cannot write the log {self.path}: {e.strerror or e}") from None
        self._encoder = schema.Encoder()
        _open_writers.add(self)

    def write(self, record: Any) -> None:
        if self._file is not None:
            try:
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
        raise LogWriteError(f"cannot write the log {self.path}: "
                            f"{error.strerror or error}") from None

    def detach(self) -> None:
        """Forget the file without writing (a forked child must not touch the parent's log)."""
        self._file = None

    def close(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except OSError as e:
                _open_writers.discard(self)
                raise LogWriteError(f"cannot write the log {self.path}: "
                                    f"{e.strerror or e}") from None
        _open_writers.discard(self)


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise LogError(f"no such log: {path}")
    if path.is_dir():
        raise LogError(f"{path} is a directory, not a log")
    if not os.access(path, os.R_OK):
        raise LogError(f"cannot read {path}: permission denied")


class LogReader:
    """Streams the records of one log. ``header`` is read on open; ``end`` and ``warnings`` are
    complete once iteration has finished."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        _check_readable(self.path)
        self.warnings: list[str] = []
        self.end: schema.End | None = None
        self.header = self._read_header()

    def _read_header(self) -> schema.Header:
        try:
            with self.path.open("rb") as f:
                first = f.readline(MAX_LINE_BYTES + 1)
        except OSError as e:
            raise LogError(f"cannot read {self.path}: {e.strerror or e}") from None
        if not first.strip():
            raise LogError(f"{self.path} is empty, not a hooktrace log")
        not_a_log = LogError(f"{self.path} is not a hooktrace log (its first line is not a header)")
        try:
            d = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise not_a_log from None
        if not isinstance(d, dict) or d.get("type") != "header":
            raise not_a_log
        version = d.get("schema")
        if isinstance(version, int) and version > schema.SCHEMA_VERSION:
            raise LogError(
                f"{self.path} has log schema {version}, newer than this hooktrace reads "
                f"({schema.SCHEMA_VERSION}): upgrade hooktrace"
            )
        if isinstance(version, int) and version < schema.SCHEMA_VERSION:
            raise LogError(
                f"{self.path} has log schema {version}, written by an older hooktrace "
                f"({d.get('hooktrace', '?')}); this one reads schema {schema.SCHEMA_VERSION}: "
                "trace the run again"
            )
        try:
            record = schema.from_dict(d)
        except schema.SchemaError as e:
            raise LogError(f"{self.path} line 1: {e}") from None
        assert isinstance(record, schema.Header)
        return record

    def __iter__(self) -> Iterator[schema.Record]:
        """Yield every record after the header, in file order."""
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise LogError(f"cannot read {self.path}: {e.strerror or e}") from None
        decode = schema.Decoder().decode
        with f:
            f.readline(MAX_LINE_BYTES + 1)
            number = 1
            pending_error: str | None = None  # a bad line is only forgiven when it is the last
            while True:
                line = f.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                number += 1
                if pending_error is not None:
                    raise LogError(pending_error)
                if len(line) > MAX_LINE_BYTES:
                    raise LogError(f"{self.path} line {number} is longer than "
                                   f"{MAX_LINE_BYTES // (1024 * 1024)} MB; not a hooktrace log")
                if not line.strip():
                    continue
                try:
                    d = orjson.loads(line)
                except orjson.JSONDecodeError:
                    pending_error = f"{self.path} line {number} is not valid JSON"
                    truncated_at = number
                    continue
                try:
                    record = decode(d)
                except schema.SchemaError as e:
                    raise LogError(f"{self.path} line {number}: {e}") from None
                if record is None:
                    continue
                if isinstance(record, schema.End):
                    self.end = record
                yield record
            if pending_error is not None:
                self.warnings.append(
                    f"{self.path} ends with a partial line {truncated_at} (the run was cut off); "
                    "read up to the line before it"
                )
        if self.end is None:
            self.warnings.append(f"{self.path} has no end record: the run did not finish")

"""Reading logs: a streaming, tolerant reader.

The reader streams (constant memory), turns a partial last line or a missing end record into a
warning, and refuses a log of a newer schema. Lines are parsed with orjson (no torch).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from hooktrace.log import schema
from hooktrace.log.decoder import (
    BackwardRow,
    BackwardRows,
    Decoder,
    ForwardRow,
    ForwardRows,
    Rows,
    StepFilter,
)
from hooktrace.log.errors import LogError

MAX_LINE_BYTES = 16 * 1024 * 1024  # no record comes near this; a longer line is not a hooktrace log
_BUFFER_BYTES = 1 << 20  # read in blocks this size

def _first_lines(path: Path, n: int) -> list[Any] | None:
    """The first ``n`` lines of a file, parsed; None where it cannot be read or one is not JSON."""
    try:
        with path.open("rb") as f:
            return [orjson.loads(f.readline(MAX_LINE_BYTES)) for _ in range(n)]
    except (OSError, orjson.JSONDecodeError):
        return None


def _is_header(d: Any) -> bool:
    return isinstance(d, dict) and d.get("type") == "header"


def is_hooktrace_log(path: Path) -> bool:
    """True when the file's first line is a hooktrace header, or the file is empty."""
    try:
        if path.stat().st_size == 0:
            return True
    except OSError:
        return False
    first = _first_lines(path, 1)
    return first is not None and _is_header(first[0])


def has_records(path: Path) -> bool:
    """True when ``path`` is a hooktrace log with a record besides its header and end record:
    the log of a run that recorded something. Reads two lines."""
    found = _first_lines(path, 2)
    return (found is not None and _is_header(found[0]) and isinstance(found[1], dict)
            and found[1].get("type") != "end")


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise LogError(f"no such log: {path}")
    if path.is_dir():
        raise LogError(f"{path} is a directory, not a log")
    if not os.access(path, os.R_OK):
        raise LogError(f"cannot read {path}: permission denied")


class LogReader:
    """Streams the records of one log. ``header`` is read on open; ``end`` and ``warnings`` are
    complete once iteration has finished. ``flow``: forward events with their data flow
    (``ForwardEvent.inputs_from``, ``made``; reading it costs a third more per event)."""

    def __init__(self, path: str | os.PathLike[str], flow: bool = False) -> None:
        self.path = Path(path)
        self.flow = flow
        _check_readable(self.path)
        self.warnings: list[str] = []
        self._decoder: Decoder | None = None
        self.header = self._read_header()

    @property
    def end(self) -> schema.End | None:
        """The end record, once iteration has reached it."""
        return self._decoder.end if self._decoder is not None else None

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
        """Yield every record after the header, in file order (events as the tracer wrote them,
        names and shapes resolved)."""
        for item in self.scan(flow=self.flow):
            if isinstance(item, ForwardRows):
                yield from map(self.forward_event, item)
            elif isinstance(item, BackwardRows):
                yield from map(self.backward_event, item)
            else:
                yield item

    def scan(self, steps: StepFilter | None = None, flow: bool = False
             ) -> Iterator[Rows | schema.Record]:
        """Every record after the header in file order, but each event as its row, in lists of
        consecutive rows of one type (``ForwardRows``, ``BackwardRows``); ``steps`` and ``flow``
        (in a log that has it: ``Header.dataflow``) as ``Decoder`` takes them. Use a list before
        taking the next item: ``modules`` may have learnt new ids by then."""
        self._decoder = Decoder(steps, flow and self.header.dataflow)
        return self._scan(self._decoder)

    @property
    def modules(self) -> dict[int, tuple[int, str]]:
        """Module id -> (model, fqn), of the module records the last ``scan`` has read."""
        assert self._decoder is not None, "scan first"
        return self._decoder.modules

    def forward_event(self, row: ForwardRow) -> schema.ForwardEvent:
        """The record of a row of the last ``scan``, names and shapes resolved."""
        assert self._decoder is not None, "scan first"
        return self._decoder.forward_event(row)

    def backward_event(self, row: BackwardRow) -> schema.BackwardEvent:
        """The record of a row of the last ``scan``, names and shapes resolved."""
        assert self._decoder is not None, "scan first"
        return self._decoder.backward_event(row)

    def _scan(self, decoder: Decoder) -> Iterator[Rows | schema.Record]:
        forward, backward, other = decoder.forward, decoder.backward, decoder.other
        loads = orjson.loads
        number = 1  # the lines before the block
        blocks = self._blocks()
        for block in blocks:
            rows: Any = ()
            run: Any = None  # the type of the events in rows; None: none since the last flush
            append: Any = None
            for line in block:
                try:
                    d = loads(line)
                    kind = d.get("type") if type(d) is dict else None
                    if kind == "forward":
                        row: Any = forward(d)
                    elif kind == "backward":
                        row = backward(d)
                    else:  # may add ids: the rows before are used first
                        if rows:
                            yield rows
                            rows, run = (), None
                        record = other(d, kind)
                        if record is not None:
                            yield record
                        continue
                except (orjson.JSONDecodeError, schema.SchemaError) as e:
                    if rows:
                        yield rows
                        rows, run = (), None
                    self._bad_line(block, line, number, blocks, e)
                    continue
                if kind != run:
                    if rows:
                        yield rows
                    rows = ForwardRows() if kind == "forward" else BackwardRows()
                    append, run = rows.append, kind
                append(row)
            if rows:
                yield rows
            number += len(block)
        if decoder.end is None:
            self.warnings.append(f"{self.path} has no end record: the run did not finish")

    def _bad_line(self, block: list[bytes], line: bytes, before: int,
                  blocks: Iterator[list[bytes]], error: Exception) -> None:
        """A LogError naming the line, except for a blank line and for a line that is not JSON
        with nothing after it (a run cut off: a warning). An equal line before it would have
        failed first, so it is the first equal one in its block."""
        if isinstance(error, schema.SchemaError):
            raise LogError(f"{self.path} line {before + 1 + block.index(line)}: {error}"
                           ) from None
        if not line.strip():
            return
        at = block.index(line)
        if at < len(block) - 1 or _more(blocks):
            raise LogError(f"{self.path} line {before + 1 + at} is not valid JSON") from None
        self.warnings.append(f"{self.path} ends with a partial line {before + 1 + at} (the run "
                             "was cut off); read up to the line before it")

    def _blocks(self) -> Iterator[list[bytes]]:
        """The lines after the header, a block at a time; a line longer than MAX_LINE_BYTES is
        a LogError once the lines before it are read."""
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise LogError(f"cannot read {self.path}: {e.strerror or e}") from None
        with f:
            f.readline(MAX_LINE_BYTES + 1)
            number, rest = 1, b""
            while chunk := f.read(_BUFFER_BYTES):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                if lines:
                    if len(lines[0]) >= MAX_LINE_BYTES:  # only the first can span chunks
                        self._too_long(number + 1)
                    yield lines
                    number += len(lines)
                if len(rest) > MAX_LINE_BYTES:
                    self._too_long(number + 1)
            if rest:
                yield [rest]

    def _too_long(self, number: int) -> None:
        raise LogError(f"{self.path} line {number} is longer than "
                       f"{MAX_LINE_BYTES // (1024 * 1024)} MB; not a hooktrace log")


def _more(blocks: Iterator[list[bytes]]) -> bool:
    """Whether anything follows the last block read (a line too long counts)."""
    try:
        return next(blocks, None) is not None
    except LogError:
        return True

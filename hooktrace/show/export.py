"""``hooktrace export``: the events of a log as flat, self-describing rows (CSV or JSON lines).

The log names modules and shapes by id to stay small; an export row spells everything out (model
name, fqn, class, shapes as text, the gradient statistics summed over a call's tensors) so that
pandas, DuckDB, a spreadsheet or ``jq`` read it without knowing the schema. Rows are written as
the log is read: memory does not grow with the log. The columns are ``COLUMNS``, documented in
docs/reading.md; standard library and orjson only.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from hooktrace.log import schema
from hooktrace.log.discovery import open_ranks
from hooktrace.log.gradstat import norm
from hooktrace.log.names import LogNames
from hooktrace.log.options import TraceOptions
from hooktrace.log.reader import LogReader
from hooktrace.log.words import ROOT, fqn_text, plural, shape_text
from hooktrace.show.calls import depth_of
from hooktrace.show.output import (
    cannot_write,
    choose_format,
    default_output,
    refuse_dir,
    refuse_log,
    whole,
)
from hooktrace.show.timeline import MARK, write_trace

FORMATS = ("csv", "jsonl", "trace")

#: (column, type, what it holds). Empty (CSV) / null (JSON) only where a column says so (pandas
#: reads an int column with empty fields as float).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rank", "int", "the process's rank (0 without a launcher)"),
    ("seq", "int", "position in the log: events in execution order"),
    ("step", "int", "the backward pass the event belongs to"),
    ("phase", "str", "forward or backward"),
    ("model", "str", "the top-level model's name"),
    ("fqn", "str", f"the module's name in named_modules(); {ROOT} for the model's root"),
    ("class", "str", "the module's class"),
    ("source", "str", "file:line of the class's forward (a class of yours; empty for torch's)"),
    ("depth", "int", "0 for the root, 1 for layer1, 2 for layer1.0"),
    ("call", "int", "the module's call within the step, from 0"),
    ("forward_seq", "int", "seq of the forward call (a backward's own forward; a forward: its "
                           "own seq; -1 unknown)"),
    ("no_grad", "bool", "forward ran with gradients off"),
    ("recompute", "bool", "re-run by activation checkpointing inside backward"),
    ("input_shapes", "str", "forward: input tensor shapes, 8x3x32x32, comma-separated"),
    ("input_dtypes", "str", "forward: their dtypes"),
    ("output_shapes", "str", "forward: output tensor shapes"),
    ("output_dtypes", "str", "forward: their dtypes"),
    ("output_nan", "int", "forward: NaN elements in the outputs (empty in backward rows)"),
    ("output_inf", "int", "forward: Inf elements in the outputs (empty in backward rows)"),
    ("grad_output_len", "int", "backward: gradients of the outputs (0 for forward rows)"),
    ("grad_input_len", "int", "backward: gradients of the inputs"),
    ("grad_output_shapes", "str", "backward: their shapes, - where no gradient flowed"),
    ("grad_input_shapes", "str", "backward: their shapes, - where no gradient flowed"),
    ("grad_output_norm", "float", "L2 norm over the grad_output tensors; empty without "
                                  "statistics"),
    ("grad_output_absmax", "float", "largest absolute grad_output element"),
    ("grad_output_nan", "int", "backward: NaN elements in grad_output (empty in forward rows)"),
    ("grad_output_inf", "int", "backward: Inf elements in grad_output (empty in forward rows)"),
    ("grad_input_norm", "float", "L2 norm over the grad_input tensors"),
    ("grad_input_absmax", "float", "largest absolute grad_input element"),
    ("grad_input_nan", "int", "backward: NaN elements in grad_input (empty in forward rows)"),
    ("grad_input_inf", "int", "backward: Inf elements in grad_input (empty in forward rows)"),
)
NAMES = tuple(name for name, _, _ in COLUMNS)
_SIDES = ("grad_output", "grad_input")
_SUMMED = ("norm", "absmax", "nan", "inf")
# what a forward row holds of the backward's columns, and a backward row of the forward's
_NO_BACKWARD: dict[str, Any] = {
    "grad_output_len": 0, "grad_input_len": 0, "grad_output_shapes": "", "grad_input_shapes": "",
    **dict.fromkeys(f"{side}_{what}" for side in _SIDES for what in _SUMMED)}
_NO_FORWARD: dict[str, Any] = {
    "no_grad": False, "input_shapes": "", "input_dtypes": "", "output_shapes": "",
    "output_dtypes": "", "output_nan": None, "output_inf": None}
_COUNTS = ("output_nan", "output_inf", "grad_output_nan", "grad_output_inf", "grad_input_nan",
           "grad_input_inf")


class _Shapes:
    """Shapes as text, memoised: the reader hands out the same list for the same signature."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, str]] = {}

    def __call__(self, shapes: Sequence[Any]) -> str:
        found = self._seen.get(id(shapes))
        if found is not None and found[0] is shapes:
            return found[1]
        text = ", ".join(shape_text(s) for s in shapes)
        self._seen[id(shapes)] = (shapes, text)  # keeps ``shapes`` alive: its id stays its own
        return text


def _summed(stats: Sequence[schema.GradStat | None] | None) -> tuple[Any, Any, int, int]:
    """(norm over all tensors, absmax, NaN count, Inf count) of one side's statistics; norm and
    absmax are None where no statistic was recorded."""
    found = [s for s in stats or () if s is not None]
    if not found:
        return None, None, 0, 0
    if len(found) == 1 and len(found[0]) == 2:  # the usual case
        return found[0][0], found[0][1], 0, 0
    total = norm(found)
    absmax = max(s[1] for s in found)
    nan = sum(int(s[2]) for s in found if len(s) == 4)
    inf = sum(int(s[3]) for s in found if len(s) == 4)
    return total, absmax, nan, inf


class _Rows:
    """Turns one log's records into rows (dicts keyed by NAMES)."""

    def __init__(self, reader: LogReader) -> None:
        self.rank = reader.header.rank
        self.stats = TraceOptions.from_header(reader.header).stats
        self.names = LogNames()
        self.shapes = _Shapes()

    def row(self, e: schema.ForwardEvent | schema.BackwardEvent) -> dict[str, Any]:
        names = self.names
        cls = names.classes.get((e.model, e.fqn), "?")
        row: dict[str, Any] = {
            "rank": self.rank, "seq": e.seq, "step": e.step, "phase": e.phase,
            "model": names.models.get(e.model, str(e.model)), "fqn": fqn_text(e.fqn),
            "class": cls, "source": names.sources.get(cls, ""), "depth": depth_of(e.fqn),
            "call": e.call, "recompute": e.recompute,
        }
        if isinstance(e, schema.ForwardEvent):
            self._forward(row, e)
        else:
            self._backward(row, e)
        if not self.stats:  # no statistics recorded: the counts are unknown, not 0
            row.update(dict.fromkeys(_COUNTS))
        return row

    def _forward(self, row: dict[str, Any], e: schema.ForwardEvent) -> None:
        bad = e.output_nonfinite or []
        row.update(_NO_BACKWARD, forward_seq=e.seq, no_grad=e.no_grad,
                   input_shapes=self.shapes(e.input_shapes), input_dtypes=", ".join(e.input_dtypes),
                   output_shapes=self.shapes(e.output_shapes),
                   output_dtypes=", ".join(e.output_dtypes),
                   output_nan=sum(b[1] for b in bad), output_inf=sum(b[2] for b in bad))

    def _backward(self, row: dict[str, Any], e: schema.BackwardEvent) -> None:
        row.update(_NO_FORWARD, forward_seq=e.fwd, grad_output_len=e.grad_output_len,
                   grad_input_len=e.grad_input_len,
                   grad_output_shapes=self.shapes(e.grad_output_shapes),
                   grad_input_shapes=self.shapes(e.grad_input_shapes))
        for side, stats in zip(_SIDES, (e.grad_output_stats, e.grad_input_stats), strict=True):
            row.update(zip((f"{side}_{what}" for what in _SUMMED), _summed(stats), strict=True))

    def rows(self, reader: LogReader) -> Iterator[dict[str, Any]]:
        for record in reader:
            if isinstance(record, (schema.ForwardEvent, schema.BackwardEvent)):
                yield self.row(record)
            else:
                self.names.take(record)


def rows(readers: Sequence[LogReader]) -> Iterator[dict[str, Any]]:
    """The rows of one log, or of the logs of several ranks of one run (rank by rank); each
    reader's warnings are complete once its rows are."""
    for reader in readers:
        yield from _Rows(reader).rows(reader)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    return value


def _csv(out: IO[str]) -> Callable[[dict[str, Any]], object]:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(NAMES)
    return lambda row: writer.writerow([_csv_value(row[name]) for name in NAMES])


def _jsonl(out: IO[str]) -> Callable[[dict[str, Any]], object]:
    # orjson writes NaN/Inf as null: the _nan/_inf counts say which
    return lambda row: out.write(orjson.dumps({name: row[name] for name in NAMES},
                                              option=orjson.OPT_APPEND_NEWLINE).decode("utf-8"))


#: each format's writer: given the output, it writes the head and returns what writes a row
WRITERS: dict[str, Callable[[IO[str]], Callable[[dict[str, Any]], object]]] = {
    "csv": _csv, "jsonl": _jsonl}


def _write(out: IO[str], fmt: str, readers: Sequence[LogReader]) -> int:
    """Write the rows of ``readers`` in ``fmt`` (trace: the timeline, ``timeline.py``); how
    many (a trace: its spans and instants)."""
    if fmt == "trace":
        return write_trace(out, readers)
    put, n = WRITERS[fmt](out), 0
    for row in rows(readers):
        put(row)
        n += 1
    return n


@dataclass(slots=True)
class Exported:
    path: Path | None  # None: written to the stream given
    format: str
    rows: int  # rows, or a trace's spans and instants
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        where = f"wrote {self.path}" if self.path else "wrote"
        what = "event" if self.format == "trace" else "row"
        return f"{where}: {plural(self.rows, what)} ({self.format})"


def _exported(head: bytes) -> bool:
    """Whether a file starts as an export does: its header row (csv), or a first row with its
    columns in their order (jsonl)."""
    first = head.split(b"\n", 1)[0]
    if first.startswith(MARK):
        return True
    if first.decode("utf-8", "replace").startswith(",".join(NAMES[:5]) + ","):
        return True
    try:
        row = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(row, dict) and tuple(row)[:5] == NAMES[:5]


def _output(logs: Sequence[Path], fmt: str | None, output: Path | None) -> tuple[str, Path]:
    if fmt is None and output is not None and output.name.endswith(".trace.json"):
        fmt = "trace"
    chosen = choose_format(fmt, output, FORMATS, "csv")
    path = output or logs[0].with_suffix(".trace.json" if chosen == "trace" else f".{chosen}")
    for log in logs:
        refuse_log(path, log, "export")
    path = output or default_output(path, _exported)
    refuse_dir(path, "export")
    return chosen, path


def write_rows(logs: Sequence[str | os.PathLike[str]], fmt: str | None = None,
           output: str | os.PathLike[str] | None = None, stream: IO[str] | None = None
           ) -> Exported:
    """``hooktrace export``: write every event of ``logs`` (one log, or the ranks of one run)
    as a row, into ``stream`` when given, else into ``output`` (default: the first log's name
    with the format's extension; csv unless ``fmt`` or the extension says jsonl). The file
    appears whole or not at all."""
    readers = open_ranks(logs)
    path: Path | None = None
    if stream is not None:
        chosen = choose_format(fmt, None, FORMATS, "csv")
        n = _write(stream, chosen, readers)
    else:
        chosen, path = _output([r.path for r in readers], fmt,
                               Path(output) if output is not None else None)
        try:
            with whole(path) as temporary, temporary.open("w", encoding="utf-8",
                                                          newline="") as f:
                n = _write(f, chosen, readers)
        except OSError as e:
            raise cannot_write(path, e) from None
    return Exported(path, chosen, n, [w for r in readers for w in r.warnings])

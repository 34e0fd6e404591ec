"""``hooktrace export``: one row per event of every checked-in log, in the log's order, with the
columns docs/reading.md lists; CSV and JSON lines holding the same values; NaN/Inf counts (and
their absence under ``--no-stats``); default output names, refusing to write over a log; the logs
of several ranks; and the thin CLI writing to standard output."""

from __future__ import annotations

import csv
import io
import math
import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from hooktrace.cli import cli
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.log.words import fqn_text
from hooktrace.show.export import NAMES, write_rows
from unit.logs import LOGS
from unit.show.handlog import Builder, chain

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reading.md"
ALL = sorted(p.stem for p in LOGS.glob("*.jsonl"))
INTS = {"rank", "seq", "step", "depth", "call", "forward_seq", "output_nan", "output_inf",
        "grad_output_len", "grad_input_len", "grad_output_nan", "grad_output_inf",
        "grad_input_nan", "grad_input_inf"}
FLOATS = {"grad_output_norm", "grad_output_absmax", "grad_input_norm", "grad_input_absmax"}
BOOLS = {"no_grad", "recompute"}


def log(name: str) -> Path:
    return LOGS / f"{name}.jsonl"


@cache
def events(path: Path) -> list[schema.ForwardEvent | schema.BackwardEvent]:
    return [r for r in LogReader(path)
            if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent))]


def exported(path: Path | list[Path], fmt: str) -> tuple[str, int]:
    stream = io.StringIO()
    done = write_rows(path if isinstance(path, list) else [path], fmt, stream=stream)
    assert done.path is None and done.format == fmt
    return stream.getvalue(), done.rows


def csv_rows(text: str) -> list[dict[str, Any]]:
    """CSV rows typed as the JSON lines are: empty -> None, ``true``/``false`` -> bool."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, Any] = {}
        for key, cell in raw.items():
            if key in INTS | FLOATS and cell == "":
                row[key] = None
            elif key in INTS:
                row[key] = int(cell)
            elif key in FLOATS:
                row[key] = float(cell)
            elif key in BOOLS:
                row[key] = {"true": True, "false": False}[cell]
            else:
                row[key] = cell
        rows.append(row)
    return rows


def json_rows(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines()]


def documented_columns() -> list[str]:
    """The column names in docs/reading.md's table of export's columns."""
    text = DOCS.read_text("utf-8")
    table = text[text.index("| column | type | what it holds |"):]
    table = table[:table.index("\n\n")]
    names: list[str] = []
    for line in table.splitlines()[2:]:
        names += re.findall(r"`([a-z_]+)`", line.split("|")[1])
    return names


def test_columns_are_the_documented_ones() -> None:
    documented = documented_columns()
    assert len(documented) == len(set(documented)) == len(NAMES) == 31
    assert set(documented) == set(NAMES)
    assert NAMES[:13] == tuple(documented[:13])  # rank .. recompute in the docs' order


# -- every log -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_one_row_per_event_in_order(name: str) -> None:
    text, n = exported(log(name), "csv")
    rows = csv_rows(text)
    found = events(log(name))
    assert n == len(rows) == len(found)
    assert text.splitlines()[0] == ",".join(NAMES)
    assert [(r["seq"], r["step"], r["phase"], r["fqn"], r["call"]) for r in rows] == \
        [(e.seq, e.step, e.phase, fqn_text(e.fqn), e.call) for e in found]


@pytest.mark.parametrize("name", ALL)
def test_csv_and_jsonl_hold_the_same_values(name: str) -> None:
    as_csv, _ = exported(log(name), "csv")
    as_json, n = exported(log(name), "jsonl")
    rows = json_rows(as_json)
    assert len(rows) == n
    assert all(list(row) == list(NAMES) for row in rows)
    for a, b in zip(csv_rows(as_csv), rows, strict=True):
        for key in NAMES:
            x, y = a[key], b[key]
            if key in FLOATS and x is not None and not math.isfinite(x):
                assert y is None  # JSON has no NaN: the counts say which
            else:
                assert x == y, (key, x, y)


@pytest.mark.parametrize("name", ALL)
def test_rows_spell_out_the_events(name: str) -> None:
    """Shapes, lengths and the forward seq a backward row joins on, from the reader's events."""
    rows = json_rows(exported(log(name), "jsonl")[0])
    for row, e in zip(rows, events(log(name)), strict=True):
        assert row["depth"] == (e.fqn.count(".") + 1 if e.fqn else 0)
        if isinstance(e, schema.ForwardEvent):
            assert row["forward_seq"] == e.seq and row["no_grad"] == e.no_grad
            assert row["input_shapes"] == ", ".join("x".join(map(str, s)) if len(s) else "()"
                                                    for s in e.input_shapes)
            assert row["grad_output_len"] == row["grad_input_len"] == 0
            assert row["grad_output_shapes"] == "" and row["grad_output_norm"] is None
        else:
            assert row["forward_seq"] == e.fwd
            assert (row["grad_output_len"], row["grad_input_len"]) == (e.grad_output_len,
                                                                       e.grad_input_len)
            assert row["grad_input_shapes"] == ", ".join(
                "-" if s is None else "x".join(map(str, s)) for s in e.grad_input_shapes)
            assert row["input_shapes"] == "" and row["output_nan"] is None


def test_mnist_rows_exact() -> None:
    rows = json_rows(exported(log("mnist"), "jsonl")[0])
    assert len(rows) == 42
    first, root_backward = rows[0], rows[7]
    assert {k: first[k] for k in ("model", "fqn", "class", "input_shapes", "output_shapes",
                                  "input_dtypes", "output_nan")} == {
        "model": "model", "fqn": "conv1", "class": "Conv2d", "input_shapes": "8x1x28x28",
        "output_shapes": "8x32x26x26", "input_dtypes": "float32", "output_nan": 0}
    assert {k: root_backward[k] for k in ("seq", "fqn", "class", "source", "forward_seq",
                                          "grad_output_shapes", "grad_input_shapes",
                                          "grad_output_norm", "grad_output_absmax",
                                          "grad_input_norm")} == {
        "seq": 8, "fqn": "(root)", "class": "Net", "source": "mnist_net.py:24", "forward_seq": 7,
        "grad_output_shapes": "8x10", "grad_input_shapes": "-", "grad_output_norm": 0.3536,
        "grad_output_absmax": 0.125, "grad_input_norm": None}
    assert all(r["source"] == "" for r in rows if r["class"] != "Net")  # torch's own classes


# -- NaN/Inf and --no-stats ------------------------------------------------------------------------

def test_nan_counts_where_the_run_went_nan() -> None:
    rows = csv_rows(exported(log("diff_nan"), "csv")[0])
    poison = [r for r in rows if r["fqn"] == "poison" and r["phase"] == "forward"]
    assert [r["output_nan"] for r in poison] == [0, 0, 0, 64, 64]
    nan_backward = [r for r in rows if r["phase"] == "backward" and r["step"] >= 3]
    assert all(r["grad_output_nan"] > 0 and math.isnan(r["grad_output_norm"])
               for r in nan_backward)
    text = exported(log("diff_nan"), "jsonl")[0]
    assert all(row["grad_output_norm"] is None for row in json_rows(text)
               if row["phase"] == "backward" and row["step"] >= 3)


def test_no_nan_counts_in_a_healthy_run() -> None:
    rows = csv_rows(exported(log("diff_a"), "csv")[0])
    counts = ["output_nan", "output_inf", "grad_output_nan", "grad_output_inf"]
    assert {r[c] for r in rows for c in counts} == {0, None}  # None: the other phase's column
    assert all(math.isfinite(r["grad_output_norm"]) for r in rows if r["phase"] == "backward")


def test_no_stats_leaves_counts_and_norms_unknown() -> None:
    rows = json_rows(exported(log("diff_nostats"), "jsonl")[0])
    assert rows
    for row in rows:
        for key in ("output_nan", "output_inf", "grad_output_nan", "grad_input_inf",
                    "grad_output_norm", "grad_input_absmax"):
            assert row[key] is None, key
    assert {r["grad_output_len"] for r in rows if r["phase"] == "backward"} == {1}


# -- output files ----------------------------------------------------------------------------------

@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "run.jsonl"
    shutil.copy(log("mnist"), target)
    return target


def test_default_output_is_csv_beside_the_log(copy: Path) -> None:
    done = write_rows([copy])
    assert (done.path, done.format, done.rows) == (copy.with_suffix(".csv"), "csv", 42)
    assert done.summary() == f"wrote {copy.with_suffix('.csv')}: 42 rows (csv)"
    assert done.path is not None
    assert done.path.read_text("utf-8") == exported(log("mnist"), "csv")[0]


@pytest.mark.parametrize(("output", "fmt", "chosen"), [
    ("rows.jsonl", None, "jsonl"), ("rows.csv", None, "csv"), ("rows.txt", None, "csv"),
    ("rows.txt", "jsonl", "jsonl"), ("rows.JSONL", None, "jsonl")])
def test_format_from_the_option_or_extension(copy: Path, output: str, fmt: str | None,
                                             chosen: str) -> None:
    done = write_rows([copy], fmt, copy.with_name(output))
    assert done.format == chosen
    assert copy.with_name(output).read_text("utf-8") == exported(log("mnist"), chosen)[0]


def test_refuses_to_write_over_the_log(copy: Path) -> None:
    """jsonl's default name is the log's own name."""
    before = copy.read_bytes()
    for output in (None, copy):
        with pytest.raises(HooktraceError, match="refusing to write the export over the log"):
            write_rows([copy], "jsonl", output)
    assert copy.read_bytes() == before
    assert sorted(p.name for p in copy.parent.iterdir()) == ["run.jsonl"]


@pytest.mark.parametrize(("fmt", "output", "message"), [
    ("xlsx", None, "unknown format 'xlsx'; choose one of csv, jsonl"),
    (None, ".", "is a directory"),
])
def test_output_errors(copy: Path, fmt: str | None, output: str | None, message: str) -> None:
    target = copy.parent if output == "." else None
    with pytest.raises(HooktraceError, match=message):
        write_rows([copy], fmt, target)
    assert sorted(p.name for p in copy.parent.iterdir()) == ["run.jsonl"]


def test_the_ranks_of_one_run_rank_after_rank(tmp_path: Path) -> None:
    paths = []
    for rank in (1, 0):
        b = Builder()
        b.model(0, "net", "Net", {"fc1": "Linear", "fc2": "Linear"})
        chain(b, 0, ["fc1", "fc2"])
        paths.append(b.write(tmp_path / f"rank{rank}.jsonl", rank=rank, world_size=2))
    text, n = exported(paths, "jsonl")
    rows = json_rows(text)
    assert n == 12
    assert [r["rank"] for r in rows] == [0] * 6 + [1] * 6
    assert [r["seq"] for r in rows] == list(range(1, 7)) * 2


# -- hooktrace export (thin CLI) -------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_cli_writes_rows_to_stdout(fmt: str) -> None:
    result = CliRunner().invoke(cli, ["export", str(log("vae")), "--format", fmt, "-o", "-"])
    assert result.exit_code == 0
    assert result.stdout == exported(log("vae"), fmt)[0]
    assert result.stderr == f"hooktrace: wrote: 24 rows ({fmt})\n"


def test_cli_crash_log_has_no_rows() -> None:
    result = CliRunner().invoke(cli, ["export", str(log("crash")), "-o", "-"])
    assert result.exit_code == 0
    assert result.stdout == ",".join(NAMES) + "\n"
    assert result.stderr == "hooktrace: wrote: 0 rows (csv)\n"


def test_cli_refusal_is_one_line(copy: Path) -> None:
    result = CliRunner().invoke(cli, ["export", str(copy), "--format", "jsonl"])
    assert result.exit_code == 2
    assert result.stderr == (f"hooktrace: error: refusing to write the export over the log "
                             f"{copy}; give another output path\n")

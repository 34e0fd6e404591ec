"""The log reader and writer: round trip, a cut-off tail tolerated, LogError for anything else."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooktrace.log import schema, wire
from hooktrace.log.decoder import BackwardRows, Decoder, ForwardRows
from hooktrace.log.errors import LogError
from hooktrace.log.reader import MAX_LINE_BYTES, LogReader
from hooktrace.log.writer import LogWriter

HEADER = schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.1.0", torch="2.15.0",
                       python="3.11.7", argv=["train.py", "--lr", "0.1"], pid=4242,
                       hostname="box", started=1700000000.5, options={"max_events": 10})
HEADER_LINE = orjson.dumps(HEADER.to_dict()) + b"\n"

RECORDS: list[Any] = [
    schema.Model(model=0, name="net", cls="Net"),
    schema.Module(model=0, fqn="", cls="Net", loose=["scale"]),
    schema.Module(model=0, fqn="fc1", cls="Linear", params=40, trainable=40,
                  aliases=["shared.fc1"]),
    schema.ForwardEvent(seq=1, step=0, model=0, fqn="fc1", call=0, input_shapes=[[5, 4]],
                        input_dtypes=["float32"], output_shapes=[[5, 8]],
                        output_dtypes=["float32"], output_nonfinite=[[0, 1, 2]]),
    schema.ForwardEvent(seq=2, step=0, model=0, fqn="", call=0, no_grad=True, recompute=True,
                        inputs_more=3, outputs_more=1, eval_mode=True),
    schema.BackwardEvent(seq=3, step=0, model=0, fqn="fc1", call=0, fwd=1, grad_input_len=2,
                         grad_output_len=1, grad_input_shapes=[None, [5, 4]],
                         grad_output_shapes=[[5, 8]], grad_input_stats=[None, [1.5, 0.25]],
                         grad_output_stats=[[math.inf, 2.0, 0.0, 3.0]]),
    schema.ParamGrads(step=0, model=0, grad_norm={"fc1": 0.5, "": None}),
    schema.Step(step=0, forward=2, backward=1),
    schema.End(status="error", events=3, steps=1, exit_code=1,
               error={"type": "ValueError", "message": "bad"}, dropped=2,
               tracer_error="RuntimeError: x"),
]

KNOWN_TYPES = tuple(
    getattr(schema, n) for n in ("Header", "Model", "Module", "ForwardEvent", "BackwardEvent",
                                 "ParamGrads", "Step", "End") if hasattr(schema, n))


def lines(*records: Any, encoder: wire.Encoder | None = None) -> bytes:
    """Records as the writer writes them (events need the module records' ids: pass one
    encoder to calls that make one log)."""
    encoder = encoder or wire.Encoder()
    return b"".join(orjson.dumps(d) + b"\n" for r in records for d in encoder.wire(r))


def write_log(path: Path, records: list[Any]) -> None:
    writer = LogWriter(path)
    for record in [HEADER, *records]:
        writer.write(record)
    writer.close()


def read_all(path: Path) -> tuple[LogReader, list[Any]]:
    reader = LogReader(path)
    return reader, list(reader)


# -- round trip ----------------------------------------------------------------------------------

def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS)
    data = path.read_bytes()
    assert data.startswith(b'{"type":"header","schema":3,')
    # 3 tensor signatures for the forward events (one of them empty), 2 for the backward one
    assert data.count(b'{"type":"tensors",') == 5
    assert data.count(b"\n") == 1 + len(RECORDS) + 5
    reader, records = read_all(path)
    assert reader.header == HEADER
    assert records == RECORDS
    assert reader.end == RECORDS[-1]
    assert reader.warnings == []


def test_reader_skips_unknown_records_keys_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    step = schema.Step(step=0, forward=1, backward=0).to_dict()
    path.write_bytes(HEADER_LINE + b'{"type":"from_the_future","x":[1,2]}\n\n   \n'
                     + orjson.dumps({**step, "new_key": {"a": 1}}) + b"\n"
                     + lines(schema.End(status="ok")))
    reader, records = read_all(path)
    assert records == [schema.Step(step=0, forward=1, backward=0), schema.End(status="ok")]
    assert reader.warnings == []


def test_reader_streams_lazily(tmp_path: Path) -> None:
    """Records before a bad line are yielded before the error is raised."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(HEADER_LINE + lines(RECORDS[0]) + b'{"type":"model"}\n' + lines(RECORDS[-1]))
    it = iter(LogReader(path))
    assert next(it) == RECORDS[0]
    with pytest.raises(LogError, match=r"line 3: missing key 'model'"):
        next(it)


# -- a log cut off ---------------------------------------------------------------------------------

def test_truncated_last_line_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS)
    data = path.read_bytes()
    end_line = lines(RECORDS[-1])
    path.write_bytes(data[: len(data) - len(end_line) // 2])  # cut inside the end record
    reader, records = read_all(path)
    assert records == RECORDS[:-1]
    assert reader.end is None
    n = data.count(b"\n")  # the line number of the cut-off end record
    assert len(reader.warnings) == 2
    assert f"partial line {n}" in reader.warnings[0]
    assert "no end record" in reader.warnings[1]


def test_truncated_after_whole_lines_warns_no_end(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS[:-1])
    reader, records = read_all(path)
    assert records == RECORDS[:-1]
    assert reader.warnings == [f"{path} has no end record: the run did not finish"]


def test_header_only_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(HEADER_LINE[:-1])  # no newline at all
    reader, records = read_all(path)
    assert reader.header == HEADER
    assert records == []
    assert len(reader.warnings) == 1 and "no end record" in reader.warnings[0]


@pytest.mark.parametrize("bad", [b"{not json", b'{"type":"forward"}', b"[1,2]", b"\xff\xfe\x00",
                                 b'{"type":"end","status":"maybe"}'])
def test_bad_line_in_the_middle_names_its_line(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "log.jsonl"
    encoder = wire.Encoder()
    path.write_bytes(HEADER_LINE + lines(*RECORDS[:2], encoder=encoder) + bad + b"\n"
                     + lines(*RECORDS[2:], encoder=encoder))
    with pytest.raises(LogError, match=r"\bline 4\b"):
        read_all(path)


# -- not a log: always LogError ------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no such log"):
        LogReader(tmp_path / "nope.jsonl")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="is a directory"):
        LogReader(tmp_path)


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"\n\n  \n", "is empty"),
    (bytes(range(256)) * 8, "not a hooktrace log"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a hooktrace log"),
    (b"[1,2]\n", "not a hooktrace log"),
    (b'"header"\n', "not a hooktrace log"),
    (b'{"type":"event"}\n', "not a hooktrace log"),
    (lines(RECORDS[0]), "not a hooktrace log"),
    (b'{"type":"header"}\n', "line 1: missing key 'schema'"),
    (b'{"type":"header","schema":"1"}\n', "line 1: key 'schema' has the wrong type"),
    (b'{"type":"header","schema":3,"argv":"train.py"}\n', "line 1: key 'argv'"),
    (b'{"type":"header","schema":99,"hooktrace":"9.0"}\n', "schema 99, newer than"),
])
def test_not_a_log(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    with pytest.raises(LogError, match=message):
        read_all(path)


@pytest.mark.parametrize(("first", "message"), [
    (b'{"type":"header","schema":99,"hooktrace":"9.0","some_new_key":1}',
     "has log schema 99, newer than this hooktrace reads ({v}): upgrade hooktrace"),
    (b'{"type":"header","schema":1,"hooktrace":"0.1.0"}',
     "has log schema 1, written by an older hooktrace (0.1.0); this one reads schema {v}: "
     "trace the run again"),
])
def test_other_schema_says_what_to_do(tmp_path: Path, first: bytes, message: str) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(first + b"\n" + b'{"type":"event","phase":"forward","seq":1}\n')
    with pytest.raises(LogError) as info:
        LogReader(path)
    assert str(info.value) == f"{path} " + message.format(v=schema.SCHEMA_VERSION)


def test_events_name_modules_and_tensors_by_id(tmp_path: Path) -> None:
    """The wire form: ids of module and tensors records, each written once, before its use."""
    path = tmp_path / "log.jsonl"
    again = schema.ForwardEvent(seq=4, step=0, model=0, fqn="fc1", call=1,
                                input_shapes=[[5, 4]], input_dtypes=["float32"],
                                output_shapes=[[5, 8]], output_dtypes=["float32"])
    write_log(path, [*RECORDS[:4], again])
    wire = path.read_bytes().splitlines()[3:]
    assert wire == [
        b'{"type":"module","id":1,"model":0,"name":"fc1","class":"Linear","params":40,'
        b'"trainable":40,"aliases":["shared.fc1"]}',
        b'{"type":"tensors","id":0,"shapes":[[5,4]],"dtypes":["float32"]}',
        b'{"type":"tensors","id":1,"shapes":[[5,8]],"dtypes":["float32"]}',
        b'{"type":"forward","seq":1,"step":0,"module":1,"call":0,"in":0,"out":1,'
        b'"output_nonfinite":[[0,1,2]]}',
        b'{"type":"forward","seq":4,"step":0,"module":1,"call":1,"in":0,"out":1}',
    ]
    assert list(LogReader(path))[-1] == again


@pytest.mark.parametrize(("line", "message"), [
    (b'{"type":"forward","seq":9,"step":0,"module":7,"call":0,"in":0,"out":0}',
     "key 'module' is not the id of a module record (7)"),
    (b'{"type":"backward","seq":9,"step":0,"module":1,"call":0,"fwd":1,"in":42,"out":0}',
     "key 'in' is not the id of a tensors record (42)"),
    (b'{"type":"tensors","id":3,"shapes":[["x"]]}', "key 'shapes' holds something that is not"),
    (b'{"type":"params","step":0,"model":0,"grad_norm":{"9":1.0}}',
     "key 'grad_norm' holds '9', not the id of a module record"),
])
def test_dangling_ids_name_the_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS[:4])
    with path.open("ab") as f:
        f.write(line + b"\n")
    with pytest.raises(LogError, match="line 8: " + re.escape(message)):
        read_all(path)


def test_line_over_16_mb(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    huge = b'{"type":"model","model":0,"class":"X","name":"' + b"a" * MAX_LINE_BYTES + b'"}\n'
    path.write_bytes(HEADER_LINE + lines(RECORDS[0]) + huge + lines(RECORDS[-1]))
    it = iter(LogReader(path))
    assert next(it) == RECORDS[0]
    with pytest.raises(LogError, match="line 3 is longer than 16 MB"):
        next(it)


def test_first_line_over_16_mb(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"type":"header","schema":3,"x":"' + b"a" * MAX_LINE_BYTES + b'"}\n')
    with pytest.raises(LogError, match="not a hooktrace log"):
        read_all(path)


def test_log_removed_after_open_is_a_log_error(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS)
    reader = LogReader(path)
    path.unlink()
    with pytest.raises(LogError):
        list(reader)


# -- fuzz: records or LogError, nothing else -----------------------------------------------------

def check_reads_or_log_error(path: Path) -> None:
    try:
        reader = LogReader(path)
        for record in reader:
            assert isinstance(record, KNOWN_TYPES)
    except LogError:
        return
    assert all(isinstance(w, str) for w in reader.warnings)
    assert isinstance(reader.header, schema.Header)


FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10) | st.sampled_from(["nan", "inf", "forward", "backward", "ok"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
KEYS = ["type", "seq", "step", "model", "module", "name", "call", "fwd", "class", "status", "id",
        "in", "out", "shapes", "dtypes", "in_stats", "out_stats", "output_nonfinite",
        "grad_norm", "error", "exit_code", "events", "aliases", "loose", "params", "no_grad",
        "eval", "schema",
        "argv", "options"]
small_ints = st.integers(min_value=-1, max_value=3)
records_like = st.dictionaries(st.sampled_from(KEYS), json_values | small_ints,
                               max_size=10).flatmap(
    lambda d: st.sampled_from(["forward", "backward", "tensors", "model", "module", "step", "end",
                               "params", "header", "other"]).map(lambda t: {**d, "type": t}))
json_lines = st.lists(st.one_of(json_values, records_like), max_size=8).map(
    lambda values: b"".join(json.dumps(v).encode() + b"\n" for v in values))


@FUZZ
@given(tail=st.binary(max_size=300))
def test_fuzz_bytes_after_header(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(HEADER_LINE + tail)
    check_reads_or_log_error(path)


@FUZZ
@given(body=json_lines, tail=st.binary(max_size=40))
def test_fuzz_json_lines_after_header(tmp_path: Path, body: bytes, tail: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(HEADER_LINE + body + tail)
    check_reads_or_log_error(path)


@FUZZ
@given(first=st.one_of(json_values, records_like), rest=json_lines)
def test_fuzz_first_line(tmp_path: Path, first: Any, rest: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(json.dumps(first).encode() + b"\n" + rest)
    check_reads_or_log_error(path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    check_reads_or_log_error(path)


# -- writer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "content", "message"), [
    ("train.py", b"import torch\nprint('precious')\n",
     "exists and is not a hooktrace log; refusing"),
    ("notes.py", b"\nprint('precious')\n", "not a hooktrace log"),  # a blank first line
])
def test_writer_refuses_a_file_that_is_not_a_log(tmp_path: Path, name: str, content: bytes,
                                                 message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(LogError, match=message):
        LogWriter(path)
    assert path.read_bytes() == content


def test_writer_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="is a directory"):
        LogWriter(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_writer_overwrites_a_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS)
    write_log(path, [RECORDS[0], schema.End(status="ok")])
    assert path.read_bytes() == HEADER_LINE + lines(RECORDS[0], schema.End(status="ok"))
    assert read_all(path)[1] == [RECORDS[0], schema.End(status="ok")]


def test_writer_overwrites_a_cut_off_log_and_an_empty_file(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(HEADER_LINE + b'{"type":"ev')
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for path in (cut, empty):
        write_log(path, [])
        assert path.read_bytes() == HEADER_LINE


def test_writer_creates_parent_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "log.jsonl"
    write_log(path, RECORDS[:1])
    assert read_all(path)[1] == RECORDS[:1]


def test_writer_cannot_create_is_a_log_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(LogError, match="cannot write the log"):
        LogWriter(tmp_path / "file" / "log.jsonl")
    assert (tmp_path / "file").read_bytes() == b"x"


# -- plain events: the fast path reads what the careful path reads --------------------------------

def decoder_with_ids() -> Decoder:
    """A decoder that knows module ids 0-1 and tensors ids 0-1, as a log's first lines make."""
    decoder = Decoder()
    for d in ({"type": "module", "id": 0, "model": 0, "name": "", "class": "Net"},
              {"type": "module", "id": 1, "model": 0, "name": "fc1", "class": "Linear"},
              {"type": "tensors", "id": 0, "shapes": [[5, 4]], "dtypes": ["float32"]},
              {"type": "tensors", "id": 1, "shapes": [None, [5, 8]]}):
        decoder.other(d, d["type"])
    return decoder


def careful(decoder: Decoder, d: dict[str, Any]) -> Any:
    """The row, or the error, of the path that checks every key one by one."""
    try:
        return decoder._forward_row(d) if d["type"] == "forward" else decoder._backward_row(d)
    except schema.SchemaError as e:
        return str(e)


odd = st.sampled_from([2, -1, True, False, 1.0, None, "1", [1], "nan"])
numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 5),
                    st.booleans(), st.sampled_from(["nan", "inf", "x"]))
a_stat = st.one_of(st.lists(numbers, min_size=2, max_size=2), st.none(),
                   st.lists(numbers, min_size=1, max_size=4), numbers, st.text(max_size=2),
                   st.dictionaries(st.text(max_size=2), numbers, min_size=2, max_size=2))
stats = st.one_of(st.lists(numbers, min_size=2, max_size=2).map(lambda s: [s]), st.none(),
                  st.lists(a_stat, min_size=1, max_size=1), st.lists(a_stat, max_size=3),
                  a_stat)
changes = st.dictionaries(
    st.sampled_from(["seq", "step", "module", "call", "fwd", "in", "out", "no_grad",
                     "recompute", "eval", "inputs_more", "output_nonfinite", "other"]),
    st.one_of(odd, st.just([[0, 1, 2]])), max_size=2)


@settings(max_examples=1000, deadline=None)
@given(kind=st.sampled_from(["forward", "backward"]), change=changes,
       drop=st.one_of(st.none(), st.sampled_from(["seq", "call", "fwd", "in", "out_stats"])),
       in_stats=st.one_of(st.just([[0.5, 1]]), stats),
       out_stats=st.one_of(st.just([[2.5, 0.25]]), stats))
def test_plain_events_read_as_the_careful_path_reads_them(
        kind: str, change: dict[str, Any], drop: str | None, in_stats: Any, out_stats: Any
) -> None:
    """A valid event, changed in a key or two: the quick checks make the row the careful path
    makes, or leave it to the careful path, or both fail alike."""
    d: dict[str, Any] = {"type": kind, "seq": 3, "step": 0, "module": 1, "call": 0, "in": 0,
                         "out": 1}
    if kind == "backward":
        d.update(fwd=2, in_stats=in_stats, out_stats=out_stats)
    d.update(change)
    d.pop(drop or "", None)
    d = orjson.loads(orjson.dumps(d))  # as parsed from a line
    decoder = decoder_with_ids()
    expected = careful(decoder, d)
    try:
        got = decoder.forward(d) if kind == "forward" else decoder.backward(d)
    except schema.SchemaError as e:
        assert str(e) == expected
        return
    if got[-1] is None:  # ``more`` None: no flag, finite statistics
        stats_read = [*(got[7] or []), *(got[8] or [])] if kind == "backward" else []
        assert all(s is None or all(map(math.isfinite, s)) for s in stats_read)
    assert repr(got) == repr(expected)  # NaN statistics are not equal to themselves
    event = decoder.forward_event if kind == "forward" else decoder.backward_event
    assert repr(event(got)) == repr(event(expected))


ODD_STATS = [[[1.0, "x"]], [["x", 1.0]], [[1.0, True]], [[False, 1]], [[1.0, "nan"]],
             [[1.0]], [[1.0, 2.0, 3.0]], [None], [], None, [[1.0, 2.0], None], [[1, 2]],
             {"a": 1, "b": 2}, "ab", [["ab"]], [{"a": 1, "b": 2}], [[[1.0, 2.0]]], [1.0, 2.0],
             [["nan", 1.0, 2, 0]], [[0.0, -2.5e-300]]]


@pytest.mark.parametrize("odd", range(len(ODD_STATS)))
@pytest.mark.parametrize("key", ["in_stats", "out_stats"])
def test_plain_statistics_are_two_numbers_each(key: str, odd: int) -> None:
    d = {"type": "backward", "seq": 3, "step": 0, "module": 1, "call": 0, "fwd": 2, "in": 0,
         "out": 1, "in_stats": [[0.5, 1]], "out_stats": [[2.5, 0.25]], key: ODD_STATS[odd]}
    decoder = decoder_with_ids()
    expected = careful(decoder, d)
    try:
        got = decoder.backward(d)
    except schema.SchemaError as e:
        got = str(e)
    assert repr(got) == repr(expected)


def test_scan_gives_events_as_rows_in_lists_of_one_type(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    plain = [schema.ForwardEvent(seq=s, step=0, model=0, fqn="fc1", call=s - 4)
             for s in (4, 5)]
    plain_backward = schema.BackwardEvent(seq=6, step=0, model=0, fqn="fc1", call=1, fwd=5,
                                          grad_input_stats=[[1.0, 0.5]],
                                          grad_output_stats=[None])
    write_log(path, [*RECORDS[:-1], *plain, plain_backward, RECORDS[-1]])
    reader = LogReader(path)
    items = list(reader.scan())
    lists = [item for item in items if isinstance(item, (ForwardRows, BackwardRows))]
    # a tensors record (the second event's signature) ends a list: a list's ids are all known
    assert [(type(run).__name__, [(r[0], r[-1] is None) for r in run]) for run in lists] == [
        ("ForwardRows", [(1, False)]), ("ForwardRows", [(2, False)]),
        ("BackwardRows", [(3, False)]), ("ForwardRows", [(4, True), (5, True)]),
        ("BackwardRows", [(6, True)])]  # (seq, no ``more``)
    records = [item for item in items if not isinstance(item, list)]
    assert records == [r for r in RECORDS if not isinstance(
        r, (schema.ForwardEvent, schema.BackwardEvent))]
    assert [reader.forward_event(r) if isinstance(run, ForwardRows) else reader.backward_event(r)
            for run in lists for r in run] == [*RECORDS[3:6], *plain, plain_backward]
    assert list(LogReader(path)) == [*RECORDS[:-1], *plain, plain_backward, RECORDS[-1]]
    assert reader.end == RECORDS[-1]


def test_plain_events_before_a_bad_line_come_first(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    encoder = wire.Encoder()
    plain = schema.ForwardEvent(seq=4, step=0, model=0, fqn="fc1", call=0)
    path.write_bytes(HEADER_LINE + lines(*RECORDS[:3], plain, encoder=encoder)
                     + b'{"type":"forward","seq":5,"step":0,"module":1,"call":"0"}\n'
                     + lines(RECORDS[-1], encoder=encoder))
    it = iter(LogReader(path))
    assert [next(it) for _ in range(4)] == [*RECORDS[:3], plain]
    with pytest.raises(LogError, match=r"line 7: key 'call' has the wrong type \(str\)"):
        next(it)


@pytest.mark.parametrize("bad", [b'{"type":"for', b"   "])
def test_lines_are_numbered_across_read_blocks(tmp_path: Path, bad: bytes) -> None:
    """The reader reads 1 MB at a time; a bad line far into the log still gets its number."""
    path = tmp_path / "log.jsonl"
    encoder = wire.Encoder()
    events = [schema.ForwardEvent(seq=s, step=s // 100, model=0, fqn="fc1", call=s % 100)
              for s in range(30_000)]
    body = lines(*RECORDS[:3], *events, encoder=encoder)
    path.write_bytes(HEADER_LINE + body + bad + b"\n" + lines(RECORDS[-1], encoder=encoder))
    n = 1 + body.count(b"\n") + 1  # the bad line's number
    assert path.stat().st_size > 2 * 1024 * 1024
    if bad.strip():
        with pytest.raises(LogError, match=rf"line {n} is not valid JSON"):
            read_all(path)
        path.write_bytes(HEADER_LINE + body + bad)  # the same line, cut off at the end
        reader, records = read_all(path)
        assert len(records) == 3 + len(events)
        assert f"partial line {n}" in reader.warnings[0]
    else:
        reader, records = read_all(path)  # a blank line is skipped
        assert records[-1] == RECORDS[-1] and reader.warnings == []


def test_params_read_module_ids_however_written(tmp_path: Path) -> None:
    """A module id written as "01" is module 1, as before the fast path for "1"."""
    path = tmp_path / "log.jsonl"
    encoder = wire.Encoder()
    path.write_bytes(HEADER_LINE + lines(*RECORDS[:3], encoder=encoder)
                     + b'{"type":"params","step":0,"model":0,"grad_norm":{"1":0.5,"0":null}}\n'
                     + b'{"type":"params","step":1,"model":0,"grad_norm":{"01":0.5,"0":1}}\n'
                     + lines(RECORDS[-1], encoder=encoder))
    params = [r for r in read_all(path)[1] if isinstance(r, schema.ParamGrads)]
    assert [p.grad_norm for p in params] == [{"fc1": 0.5, "": None}, {"fc1": 0.5, "": 1.0}]
    assert type(params[1].grad_norm[""]) is float

"""Checked reads of one line's fields (``hooktrace.log.fields``): each record that is not an event
from its line, absent keys at their defaults, a value of the wrong type named by its key, and
what a newer version may add (an unknown record or kind) skipped; each refusal beside a look-alike
that is read."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hooktrace.log import schema
from hooktrace.log.decoder import plain_stats, stats_ok
from hooktrace.log.fields import decode_number, decode_stats, get, items
from hooktrace.log.schema import SchemaError, from_dict
from hooktrace.log.wire import inputs_from

RECORDS: list[Any] = [
    schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0", torch="2.x", python="3.x",
                  argv=["a.py", "--x"], pid=3, rank=1, local_rank=1, world_size=2,
                  hostname="h", started=1.5, options={"steps": "0:3"}, dataflow=True),
    schema.Model(model=1, name="teacher", cls="Net"),
    schema.Module(model=0, fqn="fc", cls="Linear", params=4, trainable=2, aliases=["b.fc"],
                  loose=["scale"], wrapper="DataParallel"),
    schema.Anomaly(step=50, model=0, fqn="fc1", kind="nonfinite-forward", call=2,
                   detail={"weights": ["weight"]}),
    schema.Signal(step=3, model=0, fqn="", kind="eval-backward"),
    schema.Source(cls="Net", file="train.py", line=12),
    schema.Step(step=4, forward=5, backward=6),
    schema.End(status="interrupted", events=3, steps=1, exit_code=130,
               error={"type": "KeyboardInterrupt", "message": ""}, dropped=1,
               tracer_error="x", captured=2),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.TYPE)
def test_record_from_its_line(record: Any) -> None:
    assert from_dict(record.to_dict()) == record


@pytest.mark.parametrize(("line", "record"), [
    ({"type": "header", "schema": 2}, schema.Header(schema=2, hooktrace="?")),
    ({"type": "model", "model": 0, "name": "m"}, schema.Model(model=0, name="m", cls="?")),
    ({"type": "module", "model": 0, "name": ""}, schema.Module(model=0, fqn="", cls="?")),
    ({"type": "step", "step": 2}, schema.Step(step=2)),
    ({"type": "end", "status": "ok"}, schema.End(status="ok")),
    ({"type": "anomaly", "step": 1, "model": 0, "name": "x", "kind": "no-grad"},
     schema.Anomaly(step=1, model=0, fqn="x", kind="no-grad")),
    ({"type": "step", "step": 2, "forward": None}, schema.Step(step=2)),  # null: absent
])
def test_absent_keys_take_their_defaults(line: dict[str, Any], record: Any) -> None:
    assert from_dict(line) == record


def test_an_absent_list_is_a_list_of_its_own() -> None:
    a, b = (from_dict({"type": "header", "schema": 2}) for _ in range(2))
    assert isinstance(a, schema.Header) and isinstance(b, schema.Header)
    assert a.argv == b.argv == [] and a.argv is not b.argv and a.options is not b.options


@pytest.mark.parametrize("line", [
    {"type": "from_the_future", "x": 1},
    {"type": "anomaly", "step": 1, "model": 0, "name": "x", "kind": "new-kind"},
    {"type": "signal", "step": 1, "model": 0, "name": "x", "kind": "new-kind"},
    {"type": "forward"},  # events are the decoder's: from_dict knows none
])
def test_what_a_newer_version_adds_is_skipped(line: dict[str, Any]) -> None:
    assert from_dict(line) is None


@pytest.mark.parametrize(("line", "look_alike", "message"), [
    ({"type": "step", "step": True}, {"type": "step", "step": 1},
     "key 'step' has the wrong type (bool)"),
    ({"type": "step", "step": 1.0}, {"type": "step", "step": 1},
     "key 'step' has the wrong type (float)"),
    ({"type": "step", "step": "1"}, {"type": "step", "step": 1},
     "key 'step' has the wrong type (str)"),
    ({"type": "step"}, {"type": "step", "step": 0}, "missing key 'step'"),
    ({"type": "end", "status": "maybe"}, {"type": "end", "status": "interrupted"},
     "unknown end status 'maybe'"),
    ({"type": "model", "model": 0, "name": 3}, {"type": "model", "model": 0, "name": "3"},
     "key 'name' has the wrong type (int)"),
    ({"type": "header", "schema": 2, "argv": ["a", 1]}, {"type": "header", "schema": 2,
                                                          "argv": ["a", "1"]},
     "key 'argv' holds something that is not a string"),
    ({"type": "module", "model": 0, "name": "", "aliases": "x"},
     {"type": "module", "model": 0, "name": "", "aliases": ["x"]},
     "key 'aliases' has the wrong type (str)"),
    ({"type": "source", "class": "N", "file": "a.py", "line": "3"},
     {"type": "source", "class": "N", "file": "a.py", "line": 3},
     "key 'line' has the wrong type (str)"),
    ({"type": 1}, {"type": "1"}, "key 'type' has the wrong type (int)"),
    ({"kind": "step"}, {"type": "step", "step": 0}, "missing key 'type'"),
])
def test_rejects_a_wrong_value_naming_its_key(line: dict[str, Any], look_alike: dict[str, Any],
                                               message: str) -> None:
    from_dict(look_alike)  # read
    with pytest.raises(SchemaError) as info:
        from_dict(line)
    assert str(info.value) == message


@pytest.mark.parametrize("line", [[1, 2], "header", 3, None])
def test_a_record_is_a_json_object(line: Any) -> None:
    with pytest.raises(SchemaError, match="a record must be a JSON object"):
        from_dict(line)


@pytest.mark.parametrize("status", schema.END_STATUSES)
def test_every_end_status_reads(status: str) -> None:
    assert from_dict({"type": "end", "status": status}) == schema.End(status=status)


def test_get_treats_null_as_absent() -> None:
    assert get({"a": None}, "a", int, 7) == 7
    with pytest.raises(SchemaError, match="missing key 'a'"):
        get({"a": None}, "a", int)
    assert get({"a": 0}, "a", int) == 0  # a false value is no absence


@pytest.mark.parametrize(("value", "number"), [(1, 1.0), (2.5, 2.5), ("inf", math.inf),
                                               ("-inf", -math.inf)])
def test_decode_number(value: Any, number: float) -> None:
    assert decode_number(value) == number and type(decode_number(value)) is float


@pytest.mark.parametrize("value", [True, None, "NaN", "Infinity", "1.0", [1.0]])
def test_decode_number_rejects_what_is_no_number(value: Any) -> None:
    assert math.isnan(decode_number("nan"))  # the look-alike that is read
    with pytest.raises(SchemaError, match="is not a number"):
        decode_number(value)


@pytest.mark.parametrize(("stats", "read"), [
    ([[1, 2]], [[1.0, 2.0]]),
    ([["nan", "inf", 3, 0], None], [None, None]),  # NaN is not equal to itself: checked below
    ([], []),
])
def test_decode_stats(stats: Any, read: Any) -> None:
    got = decode_stats({"s": stats}, "s")
    assert got is not None and len(got) == len(read)
    if stats and stats[0][0] == "nan":
        assert math.isnan(got[0][0]) and got[0][1:] == [math.inf, 3.0, 0.0]  # type: ignore[index]
        assert got[1] is None
    else:
        assert got == read
    assert decode_stats({}, "s") is None


@pytest.mark.parametrize("stats", [[[1.0, 2.0, 3.0]], [[1.0]], [1.0, 2.0], {"a": 1}])
def test_decode_stats_rejects_what_is_no_statistic(stats: Any) -> None:
    with pytest.raises(SchemaError, match="key 's'"):
        decode_stats({"s": stats}, "s")


def test_decode_stats_rejects_a_word_for_a_number() -> None:
    assert decode_stats({"s": [["inf", 1]]}, "s") == [[math.inf, 1.0]]
    with pytest.raises(SchemaError, match="'x' is not a number"):
        decode_stats({"s": [["x", 1]]}, "s")


@pytest.mark.parametrize(("value", "plain"), [
    (None, True), ([None], True), ([[1.0, 2]], True), ([[1.0, 2.0], None], True),
    ([[1.0, "nan"]], False), ([["nan", "nan", 1, 0]], False), ([[True, 1.0]], False),
    ("ab", False), ([[1.0]], False),
])
def test_plain_statistics_are_two_numbers(value: Any, plain: bool) -> None:
    assert stats_ok(value) is plain
    assert plain_stats(value, [[0.5, 0.25]]) is plain
    assert plain_stats([[0.5, 0.25]], value) is plain


def test_shapes_and_strings() -> None:
    assert items({"s": [[1, 2], []]}, "s", "list[list[int]]") == [[1, 2], []]
    assert items({"s": [None, [3]]}, "s", "list[list[int] | None]") == [None, [3]]
    for bad in ([None], [[1, True]], [[1.0]], ["12"]):
        with pytest.raises(SchemaError, match="not a shape"):
            items({"s": bad}, "s", "list[list[int]]")
    assert items({}, "d", "list[str]") == []
    with pytest.raises(SchemaError, match="not a string"):
        items({"d": ["float32", None]}, "d", "list[str]")


# -- data flow ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "inputs", "read"), [
    ({}, 1, ([[9]], None, None, None)),
    ({}, 3, ([[9], [9], [9]], None, None, None)),
    ({}, 0, ([], None, None, None)),
    ({"from": [None, 2]}, 2, ([[], [8]], None, None, None)),
    ({"from": [[1, 4]]}, 1, ([[6, 9]], None, None, None)),  # seqs ascending
    ({"from": [1], "made": [2, 5]}, 1, ([[9]], [5, 8], None, None)),
    # which output of each producer an input used; per output, the calls that made it
    ({"from": [[1, 4], None], "from_out": [[2, -1], []]}, 2,
     ([[6, 9], []], None, [[2, -1], []], None)),
    ({"made": [2, 1], "made_out": [[1], [2], [4, 2]]}, 1,
     ([[9]], [8, 9], None, [[9], [8], [6, 8]])),
])
def test_inputs_from_offsets(line: dict[str, Any], inputs: int, read: Any) -> None:
    assert inputs_from(line, 10, inputs) == read


@pytest.mark.parametrize(("line", "message"), [
    ({"from": [1, 1]}, "one entry per tensor input (1)"),
    ({"from": [0]}, "not an offset to a call"),
    ({"from": [-1]}, "not an offset to a call"),
    ({"from": [True]}, "not an offset to a call"),
    ({"from": [[1, 0]]}, "not an offset to a call"),
    ({"from": "1"}, "one entry per tensor input"),
    ({"made": [0]}, "'made' must list offsets to calls"),
    ({"made": 3}, "'made' must list offsets to calls"),
    ({"from_out": [[0, 1]]}, "'from_out' must list, per input, an output index per producer"),
    ({"from_out": [[-2]]}, "'from_out' must list, per input, an output index per producer"),
    ({"from_out": [1]}, "'from_out' must list, per input, an output index per producer"),
    ({"made_out": [[0]]}, "'made_out' must list, per output, offsets to calls"),
    ({"made_out": [3]}, "'made_out' must list, per output, offsets to calls"),
])
def test_inputs_from_rejects_what_is_no_offset(line: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inputs_from(line, 10, 1)

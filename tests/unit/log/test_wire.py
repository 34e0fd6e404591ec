"""The wire form written (``hooktrace.log.wire``): numbers to 4 significant digits, module and
tensors records written once before their first use, data flow as offsets, and each form read
back by the decoder as it was meant."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooktrace.log import schema
from hooktrace.log.decoder import BackwardMore, Decoder, ForwardMore
from hooktrace.log.errors import LogError
from hooktrace.log.fields import decode_number, encode_number
from hooktrace.log.reader import LogReader
from hooktrace.log.wire import Encoder
from hooktrace.log.writer import LogWriter

FC = schema.Module(model=0, fqn="fc", cls="Linear", params=12, trainable=12)


def wire(*records: Any) -> list[dict[str, Any]]:
    """The lines one encoder writes for these records, as parsed from JSON."""
    encoder = Encoder()
    return [orjson.loads(orjson.dumps(d)) for r in records for d in encoder.wire(r)]


def decode(lines: list[dict[str, Any]], flow: bool = True) -> list[Any]:
    """The records a decoder makes of these lines (events resolved)."""
    decoder, out = Decoder(flow=flow), list[Any]()
    for d in lines:
        kind = d["type"]
        if kind == "forward":
            out.append(decoder.forward_event(decoder.forward(d)))
        elif kind == "backward":
            out.append(decoder.backward_event(decoder.backward(d)))
        elif (record := decoder.other(d, kind)) is not None:
            out.append(record)
    return out


def forward(seq: int, name: str = "fc", **kw: Any) -> schema.ForwardEvent:
    kw.setdefault("input_shapes", ((2, 3),))
    kw.setdefault("input_dtypes", ("float32",))
    return schema.ForwardEvent(seq=seq, step=0, model=0, fqn=name, call=0, **kw)


# -- numbers --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "written"), [
    (0.123456, 0.1235), (123456.0, 123500.0), (1e-30, 1e-30), (-2.71828, -2.718),
    (0.0, 0.0), (3, 3.0), (float("nan"), "nan"), (float("inf"), "inf"),
    (float("-inf"), "-inf"),
])
def test_encode_number(x: float, written: float | str) -> None:
    assert encode_number(x) == written
    assert type(encode_number(x)) is type(written)


@settings(max_examples=200, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300))
def test_encoded_numbers_read_back_within_4_digits(x: float) -> None:
    back = decode_number(orjson.loads(orjson.dumps(encode_number(x))))
    assert math.isclose(back, x, rel_tol=5e-4, abs_tol=0.0) or abs(x) < 1e-300


def test_a_norm_near_float_max_reads_back(tmp_path: Path) -> None:
    written = encode_number(sys.float_info.max)
    assert isinstance(written, str) or math.isfinite(written)
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    for record in (schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0"), FC,
                   schema.BackwardEvent(seq=2, step=0, model=0, fqn="fc", call=0, fwd=1,
                                        grad_output_shapes=[[2, 3]],
                                        grad_output_stats=[[sys.float_info.max, 1.0]])):
        writer.write(record)
    writer.close()
    try:
        events = [r for r in LogReader(path) if isinstance(r, schema.BackwardEvent)]
    except LogError:
        pytest.fail("the log cannot be read")
    stat = events[0].grad_output_stats[0]  # type: ignore[index]
    assert stat is not None and stat[0] > 1e308


# -- module and tensors records -------------------------------------------------------------------

def test_module_record_once_with_ids_in_order() -> None:
    root = schema.Module(model=0, fqn="", cls="Net")
    lines = wire(root, FC, forward(1), forward(2))
    modules = [d for d in lines if d["type"] == "module"]
    assert [(d["id"], d["name"]) for d in modules] == [(0, ""), (1, "fc")]
    assert [d["module"] for d in lines if d["type"] == "forward"] == [1, 1]
    assert lines[1] == {"type": "module", "id": 1, "model": 0, "name": "fc", "class": "Linear",
                        "params": 12, "trainable": 12}


def test_event_of_a_module_without_record_declares_it() -> None:
    lines = wire(forward(1, name="x"))
    assert lines[0] == {"type": "module", "id": 0, "model": 0, "name": "x", "class": "?",
                        "params": 0, "trainable": 0}
    assert decode(lines, flow=False)[-1] == forward(1, name="x", input_shapes=[[2, 3]],
                                        input_dtypes=["float32"])


def test_one_fqn_in_two_models_is_two_modules() -> None:
    lines = wire(FC, schema.Module(model=1, fqn="fc", cls="Linear"),
                 forward(1), schema.ForwardEvent(seq=2, step=0, model=1, fqn="fc", call=0))
    assert [d["module"] for d in lines if d["type"] == "forward"] == [0, 1]
    assert [(e.model, e.fqn) for e in decode(lines) if isinstance(e, schema.ForwardEvent)] == [
        (0, "fc"), (1, "fc")]


def test_a_module_put_in_another_s_place_has_a_record_and_an_id_of_its_own() -> None:
    """``model.fc = nn.Identity()`` mid-run: the events after its record name it; the same
    record again (a module built anew in each forward) writes nothing."""
    other = schema.Module(model=0, fqn="fc", cls="Identity")
    lines = wire(FC, forward(1), other, forward(2), other, FC, forward(3))
    assert [(d["id"], d["class"]) for d in lines if d["type"] == "module"] == [
        (0, "Linear"), (1, "Identity"), (2, "Linear")]
    assert [d["module"] for d in lines if d["type"] == "forward"] == [0, 1, 2]


def test_tensors_record_once_per_signature() -> None:
    lines = wire(FC, forward(1), forward(2, input_shapes=[[2, 3]], input_dtypes=["float32"]),
                 forward(3, input_dtypes=("float16",)))
    tensors = [d for d in lines if d["type"] == "tensors"]
    # tuples (the tracer's) and lists (a reader's) of one signature share an id
    assert tensors == [{"type": "tensors", "id": 0, "shapes": [[2, 3]], "dtypes": ["float32"]},
                       {"type": "tensors", "id": 1, "shapes": [], "dtypes": []},
                       {"type": "tensors", "id": 2, "shapes": [[2, 3]], "dtypes": ["float16"]}]
    assert [(d["in"], d["out"]) for d in lines if d["type"] == "forward"] == [(0, 1), (0, 1),
                                                                               (2, 1)]


def test_gradient_signatures_have_no_dtypes_and_their_own_ids() -> None:
    back = schema.BackwardEvent(seq=2, step=0, model=0, fqn="fc", call=0, fwd=1,
                                grad_input_shapes=[None], grad_output_shapes=[[2, 3]])
    lines = wire(FC, forward(1, output_shapes=((2, 3),), output_dtypes=("float32",)), back)
    tensors = [d for d in lines if d["type"] == "tensors"]
    assert tensors[1:] == [{"type": "tensors", "id": 1, "shapes": [None]},
                           {"type": "tensors", "id": 2, "shapes": [[2, 3]]}]
    assert lines[-1] == {"type": "backward", "seq": 2, "step": 0, "module": 0, "call": 0,
                         "fwd": 1, "in": 1, "out": 2}
    read = decode(lines)[-1]
    assert read == schema.BackwardEvent(seq=2, step=0, model=0, fqn="fc", call=0, fwd=1,
                                        grad_input_len=1, grad_output_len=1,
                                        grad_input_shapes=[None], grad_output_shapes=[[2, 3]])


def test_drop_is_written_as_p_and_per_and_read_back() -> None:
    drop = schema.Module(model=0, fqn="drop", cls="Dropout", drop=0.25, drop_unit="channel")
    lines = wire(drop)
    assert lines[0]["drop"] == {"p": 0.25, "per": "channel"}
    assert decode(lines) == [drop]


@pytest.mark.parametrize(("drop", "read"), [
    ({"p": 0.2, "per": "element"}, (0.2, "element")),
    ({"p": 1, "per": "batch"}, (1.0, "batch")),
    ({"p": 0.2, "per": "galaxy"}, (None, None)),  # a unit from a newer version: no drop
    ({"p": True, "per": "sample"}, (None, None)),
    ({"per": "sample"}, (None, None)),
])
def test_drop_read_tolerantly(drop: dict[str, Any], read: tuple[Any, Any]) -> None:
    line = {"type": "module", "id": 0, "model": 0, "name": "d", "class": "Dropout", "drop": drop}
    module = decode([line])[0]
    assert (module.drop, module.drop_unit) == read


# -- statistics -----------------------------------------------------------------------------------

def backward(seq: int, out_stats: Any, in_stats: Any = None) -> schema.BackwardEvent:
    return schema.BackwardEvent(seq=seq, step=0, model=0, fqn="fc", call=0, fwd=1,
                                grad_output_shapes=[[2, 3]], grad_input_shapes=[[2, 3]],
                                grad_output_stats=out_stats, grad_input_stats=in_stats)


def test_statistics_written_to_4_digits_and_nan_as_strings() -> None:
    lines = wire(FC, backward(2, [[0.123456, 2.0]], [[math.nan, math.inf, 3.0, 1.0], None]))
    event = lines[-1]
    assert event["out_stats"] == [[0.1235, 2.0]]
    assert event["in_stats"] == [["nan", "inf", 3.0, 1.0], None]
    read = decode(lines)[-1]
    assert read.grad_output_stats == [[0.1235, 2.0]]
    assert math.isnan(read.grad_input_stats[0][0]) and read.grad_input_stats[0][1:] == [
        math.inf, 3.0, 1.0]


def test_statistics_off_leaves_their_keys_out() -> None:
    event = wire(FC, backward(2, None))[-1]
    assert "out_stats" not in event and "in_stats" not in event
    assert decode(wire(FC, backward(2, None)))[-1].grad_output_stats is None


def test_a_statistic_list_changed_in_place_is_encoded_anew() -> None:
    """Only tuples are remembered as encoded: a list may change between two events."""
    stat = [1.0, 2.0]
    encoder = Encoder()
    first = encoder.wire(backward(2, [stat]))[-1]["out_stats"]
    stat[0] = 5.0
    second = encoder.wire(backward(3, [stat]))[-1]["out_stats"]
    assert (first, second) == ([[1.0, 2.0]], [[5.0, 2.0]])
    same = (0.5, 0.25)
    assert encoder.wire(backward(4, [same], [same]))[-1]["in_stats"] == [[0.5, 0.25]]
    assert encoder.wire(backward(5, [same]))[-1]["out_stats"] == [[0.5, 0.25]]


def test_params_name_modules_by_id_and_round_numbers() -> None:
    lines = wire(schema.Module(model=0, fqn="", cls="Net"), FC,
                 schema.ParamGrads(step=0, model=0, grad_norm={"fc": 0.123456, "": None,
                                                               "new": 2.0}))
    assert lines[2] == {"type": "module", "id": 2, "model": 0, "name": "new", "class": "?",
                        "params": 0, "trainable": 0}
    assert lines[3] == {"type": "params", "step": 0, "model": 0,
                        "grad_norm": {"1": 0.1235, "0": None, "2": 2.0}}
    assert decode(lines)[-1] == schema.ParamGrads(
        step=0, model=0, grad_norm={"fc": 0.1235, "": None, "new": 2.0})


def test_header_writes_dataflow_only_when_true() -> None:
    header = schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0")
    assert "dataflow" not in wire(header)[0]
    header.dataflow = True
    assert wire(header)[0]["dataflow"] is True
    assert decode(wire(header)) == [header]


# -- data flow: offsets back from seq -------------------------------------------------------------

@pytest.mark.parametrize(("inputs_from", "made", "keys"), [
    ([(9,)], None, {}),  # the call just before: left out
    ([(9,), (9,)], None, {}),
    ([], None, {}),  # no tensor input
    ([()], None, {"from": [None]}),  # a model input
    ([(7,)], None, {"from": [3]}),
    ([(9,), ()], None, {"from": [1, None]}),
    ([(4, 9)], None, {"from": [[6, 1]]}),  # a residual: the sum of two calls' outputs
    ([(9,)], [6, 8], {"made": [4, 2]}),
    ([()], [8], {"from": [None], "made": [2]}),
])
def test_data_flow_written_as_offsets_and_read_back(
        inputs_from: list[tuple[int, ...]], made: list[int] | None, keys: dict[str, Any]
) -> None:
    shapes = tuple((2, 3) for _ in inputs_from)
    event = forward(10, input_shapes=shapes, input_dtypes=tuple("float32" for _ in shapes),
                    inputs_from=inputs_from, made=made)
    lines = wire(FC, event)
    written = {k: v for k, v in lines[-1].items() if k in ("from", "made")}
    assert written == keys
    read = decode(lines)[-1]
    assert read.inputs_from == [sorted(calls) for calls in inputs_from]
    assert read.made == made


@pytest.mark.parametrize("flow", [True, False])
def test_made_no_history_written_only_when_true_and_read_back(flow: bool) -> None:
    """A flag, read whether the data flow is asked for or not (``check`` does not ask)."""
    header = schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0")
    assert "made_no_history" not in wire(header)[0]
    header.made_no_history = True
    assert decode(wire(header)) == [header]
    plain, cut = forward(10, made=[8]), forward(11, made=[8], made_no_history=True)
    lines = wire(FC, plain, cut)
    assert "made_no_history" not in lines[-2] and lines[-1]["made_no_history"] is True
    assert [e.made_no_history for e in decode(lines, flow)[-2:]] == [False, True]


def test_without_dataflow_no_flow_is_written() -> None:
    event = wire(FC, forward(10, inputs_from=None, made=None))[-1]
    assert "from" not in event and "made" not in event


def test_data_flow_from_the_call_before_is_left_out_in_lists_too() -> None:
    event = wire(FC, forward(10, inputs_from=[[9]]))[-1]
    assert "from" not in event


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(2, 40), data=st.data())
def test_any_data_flow_reads_back(seq: int, data: st.DataObject) -> None:
    producers = st.lists(st.integers(1, seq - 1), unique=True, max_size=3).map(
        lambda xs: tuple(sorted(xs)))
    inputs_from = data.draw(st.lists(producers, max_size=4))
    made = data.draw(st.one_of(st.none(), st.lists(st.integers(1, seq - 1), min_size=1,
                                                   unique=True, max_size=3).map(sorted)))
    shapes = tuple((1,) for _ in inputs_from)
    event = forward(seq, input_shapes=shapes, input_dtypes=tuple("f" for _ in shapes),
                    inputs_from=inputs_from, made=made)
    lines = wire(FC, event)
    read = decode(lines)[-1]
    assert read.inputs_from == [list(calls) for calls in inputs_from]
    assert read.made == made
    assert decode(lines, flow=False)[-1].inputs_from is None


def test_a_rows_more_holds_its_events_last_fields() -> None:
    """``Decoder.forward_event`` makes the record from a row's ``more`` by position."""
    event = dataclasses.fields(schema.ForwardEvent)
    assert ForwardMore._fields == tuple(f.name for f in event[-len(ForwardMore._fields):])
    assert ForwardMore() == tuple(f.default for f in event[-len(ForwardMore._fields):])
    assert set(BackwardMore._fields) <= {f.name for f in dataclasses.fields(schema.BackwardEvent)}

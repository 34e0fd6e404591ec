"""The ``ops`` record (``hooktrace.log.ops``): the operations of a zoomed call, each with its
``file:line``, written and read back; in the checked-in logs, each operation's ``code`` is the
text of its line, its slots follow the data, and its record names a forward of its call."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from hooktrace.log import schema
from hooktrace.log.ops import Op, Ops
from hooktrace.log.reader import LogReader
from hooktrace.log.schema import SchemaError, from_dict
from hooktrace.log.wire import Encoder
from hooktrace.log.writer import LogWriter
from unit.logs import LOGS

ROOT = Path(__file__).resolve().parents[3]
WITH_OPS = ["ops", "detached", "dead_relu", "nan_layer", "diff_nan"]


def records(name: str) -> list[Any]:
    return list(LogReader(LOGS / f"{name}.jsonl"))


def script_line(file: str, line: int) -> str:
    for folder in (ROOT / "samples", ROOT / "tests" / "scripts"):
        if (folder / file).is_file():
            return (folder / file).read_text(encoding="utf-8").splitlines()[line - 1]
    raise AssertionError(f"no script {file}")


# -- by hand --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "text"), [
    (Op("Tensor.detach"), ".detach()"),
    (Op("Tensor.data"), ".data"),
    (Op("Tensor.T"), ".T"),
    (Op("torch.sigmoid"), "torch.sigmoid()"),
    (Op("F.relu"), "F.relu()"),
    (Op("Linear", child="branch_b.0"), "branch_b.0 (Linear)"),
])
def test_op_text_reads_as_code_writes_it(op: Op, text: str) -> None:
    assert op.text == text


def test_op_site_and_leaving_torch() -> None:
    assert Op("F.relu", file="a.py", line=3).site == "a.py:3"
    assert Op("F.relu").site is None
    assert Op("Tensor.item").leaves_torch and Op("Tensor.numpy").leaves_torch
    assert not Op("Tensor.detach").leaves_torch  # still a tensor, though without a gradient


def test_op_to_dict_leaves_defaults_out() -> None:
    assert Op("F.relu").to_dict() == {"op": "F.relu", "ins": [], "outs": [], "in_shapes": [],
                                      "out_shapes": [], "out_dtypes": [], "in_grad": [],
                                      "out_grad": []}
    full = Op("Tensor.clamp_", file="a.py", line=2, code="x.clamp_(0)", ins=[0],
              outs=[0], no_grad=True, inplace=True, node="ClampBackward1",
              nonfinite=[[0, 1, 0]]).to_dict()
    assert full["no_grad"] is True and full["inplace"] is True and full["nonfinite"] == [[0, 1, 0]]
    assert "nonfinite" not in Op("F.relu", nonfinite=[]).to_dict()


def test_ops_more_only_when_some_were_left_out() -> None:
    assert "more" not in Ops(step=0, fwd=1, model=0, fqn="fc", call=0).to_dict()
    assert Ops(step=0, fwd=1, model=0, fqn="fc", call=0, more=3).to_dict()["more"] == 3


def without_grads(record: Ops) -> Ops:
    return dataclasses.replace(record, ops=[dataclasses.replace(o, grad_out=None, grad_in=None)
                                            for o in record.ops])


def test_ops_round_trip_through_a_log(tmp_path: Path) -> None:
    nan = math.nan
    ops = Ops(step=1, fwd=-1, model=0, fqn="fc", call=2, inputs=1, in_grad=[True],
              outputs=[2], more=4, ops=[
                  Op("Tensor.sub", file="m.py", line=7, code="x - 1", ins=[0], outs=[1],
                     in_shapes=[[4]], out_shapes=[[4]], out_dtypes=["float32"], in_grad=[True],
                     out_grad=[True], node="SubBackward0",
                     grad_out=[[0.123456, 1.0]], grad_in=[[nan, nan, 3.0, 0.0], None]),
                  Op("Linear", file="m.py", line=8, ins=[1], outs=[2], child="fc.inner"),
              ])
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    for record in (schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0"), ops,
                   schema.End(status="ok")):
        writer.write(record)
    writer.close()
    line = orjson.loads(path.read_bytes().splitlines()[1])
    assert line["ops"][0]["grad_out"] == [[0.1235, 1.0]]
    assert line["ops"][0]["grad_in"] == [["nan", "nan", 3.0, 0.0], None]
    [read] = [r for r in LogReader(path) if isinstance(r, Ops)]
    assert read.ops[0].grad_out == [[0.1235, 1.0]]
    assert math.isnan(read.ops[0].grad_in[0][0])  # type: ignore[index]
    assert without_grads(read) == without_grads(ops)


def test_ops_line_is_written_as_the_encoder_writes_it() -> None:
    ops = Ops(step=0, fwd=3, model=0, fqn="fc", call=0, ops=[Op("F.relu", line=1)])
    assert Encoder().wire(ops) == [{"type": "ops", "step": 0, "fwd": 3, "model": 0, "name": "fc",
                                    "call": 0, "inputs": 0, "in_grad": [], "outputs": [],
                                    "ops": [Op("F.relu", line=1).to_dict()]}]


@pytest.mark.parametrize(("op", "look_alike", "message"), [
    ("F.relu", {"op": "F.relu"}, "key 'ops' holds 'F.relu', not a JSON object"),
    ({"op": "F.relu", "ins": [True]}, {"op": "F.relu", "ins": [1]}, "'ins' holds something"),
    ({"op": "F.relu", "in_grad": [1]}, {"op": "F.relu", "in_grad": [True]},
     "'in_grad' holds something that is not true or false"),
    ({"op": "F.relu", "line": "3"}, {"op": "F.relu", "line": 3}, "key 'line' has the wrong type"),
    ({"file": "a.py"}, {"op": "?", "file": "a.py"}, "missing key 'op'"),
    ({"op": "F.relu", "grad_in": [[1.0]]}, {"op": "F.relu", "grad_in": [[1.0, 2.0]]},
     "'grad_in' holds something that is not a gradient statistic"),
])
def test_rejects_what_is_no_operation(op: Any, look_alike: dict[str, Any], message: str) -> None:
    line = {"type": "ops", "step": 0, "model": 0, "name": "fc"}
    assert isinstance(from_dict({**line, "ops": [look_alike]}), Ops)
    with pytest.raises(SchemaError, match=message):
        from_dict({**line, "ops": [op]})


def test_ops_line_defaults() -> None:
    read = from_dict({"type": "ops", "step": 0, "model": 0, "name": "fc"})
    assert read == Ops(step=0, fwd=-1, model=0, fqn="fc", call=0)


# -- the checked-in logs --------------------------------------------------------------------------

@pytest.mark.parametrize("name", WITH_OPS)
def test_each_operation_has_its_line_of_code(name: str) -> None:
    found = [r for r in records(name) if isinstance(r, Ops)]
    assert found
    for record in found:
        for op in record.ops:
            assert op.file is not None and op.line is not None and op.site == f"{op.file}:{op.line}"
            assert op.code == script_line(op.file, op.line).strip()[:120], op.site


@pytest.mark.parametrize("name", WITH_OPS)
def test_ops_name_the_forward_of_their_call(name: str) -> None:
    found = records(name)
    forwards = {e.seq: e for e in found if isinstance(e, schema.ForwardEvent)}
    for record in (r for r in found if isinstance(r, Ops)):
        call = forwards[record.fwd]
        assert (call.step, call.model, call.fqn, call.call) == (
            record.step, record.model, record.fqn, record.call)
        assert record.inputs == len(record.in_grad) <= len(call.input_shapes)


@pytest.mark.parametrize("name", WITH_OPS)
def test_slots_follow_the_data(name: str) -> None:
    for record in (r for r in records(name) if isinstance(r, Ops)):
        known = set(range(record.inputs))
        for op in record.ops:
            assert all(s == -1 or s in known for s in op.ins), (record.fqn, op.op)
            assert len(op.ins) == len(op.in_shapes) == len(op.in_grad)
            assert len(op.outs) == len(op.out_shapes) == len(op.out_dtypes) == len(op.out_grad)
            known |= set(op.outs)
        assert set(record.outputs) <= known
        assert record.more == 0


def test_ops_option_zooms_every_call_it_names() -> None:
    found = records("ops")
    zoomed = {(r.step, r.fqn) for r in found if isinstance(r, Ops)}
    wanted = {(step, name) for step in range(3)
              for name in ("branch_b", "branch_b.0", "branch_b.1", "branch_b.2")}
    assert wanted <= zoomed
    children = [(op.op, op.child) for r in found if isinstance(r, Ops) and r.fqn == "branch_b"
                for op in r.ops]
    assert children[:3] == [("Linear", "branch_b.0"), ("ReLU", "branch_b.1"),
                            ("Linear", "branch_b.2")]


def test_the_detach_that_stops_the_gradient_is_recorded() -> None:
    [root] = [r for r in records("detached") if isinstance(r, Ops) and r.step == 1]
    detach = [op for op in root.ops if op.op == "Tensor.detach"]
    assert len(detach) == 1 and detach[0].text == ".detach()"
    assert detach[0].site == "detached_branch.py:26" and detach[0].node is None
    add = root.ops[-1]
    assert add.op == "Tensor.add" and add.grad_in is not None and add.grad_in[1] is None


def test_nan_ops_mark_their_nonfinite_outputs() -> None:
    [record] = [r for r in records("nan_layer") if isinstance(r, Ops)]
    sub, log = record.ops
    assert (sub.op, log.op) == ("Tensor.sub", "torch.log")
    assert sub.nonfinite is not None and sub.nonfinite[0][0] == 0 and sub.nonfinite[0][1] > 0
    assert log.nonfinite == [[0, 256, 0]] and log.grad_out is not None
    assert math.isnan(log.grad_out[0][0]) and log.grad_out[0][2] == 256  # type: ignore[index]

"""The op-level zoom (``--ops``): inside chosen calls, each tensor operation in order with its
line, slots, shapes and gradients; nothing outside them; the program unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import read_log
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import hooktrace
from hooktrace.log import schema

HERE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# marker``."""
    [number] = [i for i, text in enumerate(HERE, 1) if text.rstrip().endswith(f"# {marker}")]
    return number


class Clip(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().cpu().numpy()  # numpy
        return torch.from_numpy(np.clip(a, -1, 1))


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.fc(x))  # sigmoid
        with torch.no_grad():
            scale = s.mean() * 2  # no_grad
        return x * s + scale  # mul


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.clip = Clip()
        self.gate = Gate()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.clip(self.enc(x))))


class Healthy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.gate = Gate()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.enc(x)))


def ops_of(path: Path) -> list[schema.Ops]:
    return [r for r in read_log(path) if isinstance(r, schema.Ops)]


def train(net: nn.Module, n: int = 2, **options: Any) -> tuple[list[torch.Tensor], Any]:
    """Steps of SGD on fixed batches: the losses and the gradients, traced or not."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    path = options.pop("path", None)
    session = hooktrace.trace(path, model=net, **options) if path else None
    if session is not None:
        session.start()
    try:
        for _ in range(n):
            opt.zero_grad()
            loss = net(torch.randn(3, 4)).pow(2).mean()
            loss.backward()
            losses.append(loss.detach())
            opt.step()
    finally:
        if session is not None:
            session.stop()
    return losses, [p.detach().clone() for p in net.parameters()]


def test_the_operations_of_a_zoomed_call_in_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "log.jsonl"
    train(Net(), path=path, ops=["clip", "gate"])
    found = ops_of(path)
    # step 1 also zooms into the root: in step 0 enc's backward never began, inside its forward
    assert [(r.step, r.fqn) for r in found] == [(0, "clip"), (0, "gate"), (1, "clip"),
                                                 (1, "gate"), (1, "")]
    clip, gate = found[0], found[1]
    assert [(op.op, op.line, op.ins, op.outs, op.in_grad, op.out_grad) for op in clip.ops] == [
        ("Tensor.detach", line_of("numpy"), [0], [1], [True], [False]),
        ("Tensor.cpu", line_of("numpy"), [1], [1], [False], [False]),  # the same tensor
        ("Tensor.numpy", line_of("numpy"), [1], [], [False], []),
    ]
    assert Path(clip.ops[0].file or "").name == Path(__file__).name
    assert clip.ops[0].code == "a = x.detach().cpu().numpy()  # numpy"
    assert (clip.inputs, clip.in_grad, clip.outputs) == (1, [True], [-1])  # made from numpy
    assert [(op.op, op.child, op.line, op.ins, op.outs, op.no_grad, op.node)
            for op in gate.ops] == [
        ("Linear", "gate.fc", line_of("sigmoid"), [0], [1], False, "AddmmBackward0"),
        ("torch.sigmoid", None, line_of("sigmoid"), [1], [2], False, "SigmoidBackward0"),
        ("Tensor.mean", None, line_of("no_grad"), [2], [3], True, None),
        ("Tensor.mul", None, line_of("no_grad"), [3], [4], True, None),
        ("Tensor.mul", None, line_of("mul"), [0, 2], [5], False, "MulBackward0"),
        ("Tensor.add", None, line_of("mul"), [5, 4], [6], False, "AddBackward0"),
    ]
    assert gate.outputs == [6]
    assert gate.ops[1].out_shapes == [[3, 4]] and gate.ops[1].out_dtypes == ["float32"]
    # backward: what each op's node received and passed back; none for a child's call
    sigmoid, mul = gate.ops[1], gate.ops[4]
    assert gate.ops[0].grad_out is None
    assert sigmoid.grad_out is not None and sigmoid.grad_in is not None
    assert len(sigmoid.grad_out) == 1 and len(sigmoid.grad_in) == 1
    assert mul.grad_in is not None and mul.grad_in[0] is None  # x needs no gradient
    assert mul.grad_in[1] is not None and mul.grad_in[1][0] > 0


def test_nothing_outside_the_zoomed_calls(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "log.jsonl"
    train(Healthy(), n=4, path=path)
    assert ops_of(path) == []  # nothing chosen, nothing wrong: no zoom
    train(Healthy(), path=path, ops=["enc"])
    [first, second] = ops_of(path)
    assert [op.op for op in first.ops] == ["F.linear"]
    assert [op.op for op in second.ops] == ["F.linear"]
    assert _get_current_function_mode_stack() == []


def test_only_recorded_steps_are_zoomed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "log.jsonl"
    train(Healthy(), n=4, path=path, ops=["gate"], steps="1,3")
    assert [(r.step, r.fqn) for r in ops_of(path)] == [(1, "gate"), (3, "gate")]


@pytest.mark.parametrize("ops", [["*"], ["gate", "gate.*"]])
def test_the_program_is_unchanged(tmp_path: Path, ops: list[str]) -> None:
    torch.manual_seed(0)
    net = Net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    plain_losses, plain_params = train(net, n=3)
    net.load_state_dict(state)
    traced_losses, traced_params = train(net, n=3, path=tmp_path / "log.jsonl", ops=ops)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, traced_losses, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain_params, traced_params, strict=True))
    assert ops_of(tmp_path / "log.jsonl")


class InPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)  # inplace sigmoid
        s.clamp_(0.1, 0.9)  # inplace clamp
        return s


def run_inplace(path: Path | None) -> str:
    net = nn.Sequential(nn.Linear(4, 4), InPlace())
    session = hooktrace.trace(path, model=net, ops=["1"]).start() if path else None
    try:
        net(torch.randn(2, 4)).sum().backward()
    except RuntimeError as e:
        return str(e)
    finally:
        if session is not None:
            session.stop()
    raise AssertionError("no error")


def test_an_inplace_change_and_the_backward_error_it_makes(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert run_inplace(path) == run_inplace(None)  # the same error, traced or not
    assert _get_current_function_mode_stack() == []
    [found] = ops_of(path)
    sigmoid, clamp = found.ops
    assert (sigmoid.op, sigmoid.line, sigmoid.node, sigmoid.outs) == (
        "torch.sigmoid", line_of("inplace sigmoid"), "SigmoidBackward0", [1])
    assert (clamp.op, clamp.line, clamp.inplace, clamp.ins, clamp.outs, clamp.node) == (
        "Tensor.clamp_", line_of("inplace clamp"), True, [1], [1], "ClampBackward1")
    assert clamp.grad_out is not None  # its node ran before the sigmoid's raised
    assert sigmoid.grad_out is None


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x * 2).sum() != 0:  # before raising
            raise ValueError("bad input")
        return x


def test_a_forward_that_raises_inside_a_zoomed_call(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    net = nn.Sequential(nn.Linear(4, 4), Raises())
    with pytest.raises(ValueError, match="bad input"), hooktrace.trace(path, model=net,
                                                                         ops=["1"]):
        net(torch.randn(2, 4))
    assert _get_current_function_mode_stack() == []
    [found] = ops_of(path)
    assert [(op.op, op.line) for op in found.ops] == [
        (name, line_of("before raising")) for name in ("Tensor.mul", "Tensor.sum", "Tensor.ne")]
    assert (found.fwd, found.outputs) == (-1, [])  # no forward event: the call raised
    assert torch.ones(2).add(1).sum().item() == 4  # no mode left to see operations


class Unsafe(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x.relu()
        root = torch.sqrt(r)  # sqrt at 0
        out = torch.where(r > 0, root, torch.zeros_like(r))
        return out + torch.log(x)  # log


def test_nonfinite_outputs_and_gradients_of_operations(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    net = nn.Sequential(nn.Linear(4, 4), Unsafe())
    torch.manual_seed(0)
    with hooktrace.trace(path, model=net, ops=["1"]):
        net(torch.randn(8, 4)).nan_to_num().sum().backward()
    [found] = ops_of(path)
    by_name = {op.op: op for op in found.ops}
    sqrt, log = by_name["torch.sqrt"], by_name["torch.log"]
    assert not sqrt.nonfinite and log.nonfinite and log.nonfinite[0][1] > 0  # NaN from log(<0)
    assert sqrt.grad_out is not None and sqrt.grad_in is not None
    assert np.isfinite(sqrt.grad_out[0][0]) and not np.isfinite(sqrt.grad_in[0][0])


def test_without_statistics_no_numbers(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(Healthy(), path=path, ops=["gate"], stats=False)
    [first, _] = ops_of(path)
    assert [op.op for op in first.ops][:2] == ["Linear", "torch.sigmoid"]
    assert all(op.grad_out is None and op.nonfinite is None for op in first.ops)


def test_the_record_reads_back_as_written(tmp_path: Path) -> None:
    from hooktrace.log.reader import LogReader
    from hooktrace.log.writer import LogWriter

    op = schema.Op("torch.sqrt", "train.py", 12, "r = x.sqrt()", ins=[0], outs=[1],
                   in_shapes=[[2, 3]], out_shapes=[[2, 3]], out_dtypes=["float32"],
                   in_grad=[True], out_grad=[True], node="SqrtBackward0",
                   nonfinite=[[0, 1, 0]], grad_out=[[1.5, 0.5]],
                   grad_in=[[float("nan"), float("inf"), 3.0, 1.0], None])
    child = schema.Op("Linear", "train.py", 11, ins=[0], child="fc", no_grad=True)
    record = schema.Ops(2, 17, 0, "block", 1, inputs=1, in_grad=[True], outputs=[1],
                        ops=[child, op], more=3)
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0"))
    writer.write(record)
    writer.write(schema.End(status="ok"))
    writer.close()
    assert b'"grad_in":[["nan","inf",3.0,1.0],null]' in path.read_bytes()
    [back, _] = list(LogReader(path))
    assert isinstance(back, schema.Ops)
    got = back.ops[1].grad_in
    assert got is not None and got[1] is None and np.isnan(got[0][0])
    back.ops[1].grad_in = op.grad_in = None  # NaN is not equal to itself
    assert back == record
    assert (op.text, child.text, op.site) == ("torch.sqrt()", "fc (Linear)", "train.py:12")


def test_the_device_path_fills_the_same_numbers(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator the numbers wait for the step's end (run here on CPU tensors)."""
    from hooktrace.observe.stats import DEFER_ENV

    def numbers(defer: bool) -> list[Any]:
        if defer:
            monkeypatch.setenv(DEFER_ENV, "1")
        else:
            monkeypatch.delenv(DEFER_ENV, raising=False)
        path = tmp_path / f"log{int(defer)}.jsonl"
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), Unsafe())
        with hooktrace.trace(path, model=net, ops=["1"]):
            net(torch.randn(8, 4)).nan_to_num().sum().backward()
        [found] = ops_of(path)
        return [(op.op, op.nonfinite, [None if s is None else [float(f"{v:.4g}") for v in s]
                                       for s in op.grad_in or []]) for op in found.ops]

    host, device = numbers(False), numbers(True)
    assert str(device) == str(host)  # (NaN compares unequal: their text agrees)
    assert any(op == "torch.log" and nonfinite for op, nonfinite, _ in device)


class UnderDevice(nn.Module):
    """A forward that pushes a torch function mode of its own around a child's call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.device("cpu"):  # a TorchFunctionMode
            y = self.fc(x)
            z = torch.zeros(4)  # made under it
        return y * 2 + z


def test_a_mode_the_program_pushes_keeps_its_place(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    net = nn.Sequential(nn.Linear(4, 4), UnderDevice())
    with hooktrace.trace(path, model=net, ops=["1"]):
        for _ in range(2):
            net(torch.randn(2, 4)).sum().backward()
            assert _get_current_function_mode_stack() == []
    [first, _] = ops_of(path)
    assert [op.op for op in first.ops] == ["Linear", "torch.zeros", "Tensor.mul",
                                           "Tensor.add"]
    assert first.ops[0].child == "1.fc"

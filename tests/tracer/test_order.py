"""Exact forward/backward orders, call indices and shapes on small inline models.

In the style of PyTorch's own ModuleTracker tests: every expectation is a literal list, so a
reordering, a missing or a duplicated event fails the test.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import SAMPLES, events, names, read_log
from torch import nn
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.log import schema

sys.path.insert(0, str(SAMPLES))
from mnist_net import Net as MnistNet

MNIST_FORWARD = ["conv1", "conv2", "dropout1", "fc1", "dropout2", "fc2", ""]
MNIST_BACKWARD = ["", "fc2", "dropout2", "fc1", "dropout1", "conv2", "conv1"]


def records_of(path: Path, kind: type) -> list:
    return [r for r in read_log(path) if isinstance(r, kind)]


def end_of(path: Path) -> schema.End:
    ends = records_of(path, schema.End)
    assert len(ends) == 1
    return ends[0]


def assert_pairing(path: Path) -> None:
    """Every backward event's ``fwd`` is the seq of a forward event of the same module call."""
    forward = {e.seq: e for e in events(path, "forward")}
    for b in events(path, "backward"):
        f = forward[b.fwd]
        assert (f.model, f.fqn, f.call, f.recompute) == (b.model, b.fqn, b.call, b.recompute)
        assert f.seq < b.seq


def assert_seq_increasing(path: Path) -> None:
    seqs = [e.seq for e in events(path)]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)


def mnist_steps(path: Path, steps: int, batch: int = 2) -> None:
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with hooktrace.trace(path, model=model):
        for _ in range(steps):
            data = torch.randn(batch, 1, 28, 28)
            target = torch.randint(0, 10, (batch,))
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()


# -- the MNIST sample ---------------------------------------------------------------------------


def test_mnist_forward_and_backward_order(log_path: Path) -> None:
    mnist_steps(log_path, 1)
    assert names(log_path, "forward") == MNIST_FORWARD
    assert names(log_path, "backward") == MNIST_BACKWARD
    assert [e.call for e in events(log_path)] == [0] * 14
    assert [e.seq for e in events(log_path)] == list(range(1, 15))
    assert_pairing(log_path)
    # backward i pairs with forward 6 - i: the exact reverse of the chain
    fwd = events(log_path, "forward")
    assert [b.fwd for b in events(log_path, "backward")] == [f.seq for f in reversed(fwd)]


def test_mnist_shapes(log_path: Path) -> None:
    mnist_steps(log_path, 1)
    fwd = {e.fqn: e for e in events(log_path, "forward")}
    assert fwd["conv1"].input_shapes == [[2, 1, 28, 28]]
    assert fwd["conv1"].output_shapes == [[2, 32, 26, 26]]
    assert fwd["conv2"].output_shapes == [[2, 64, 24, 24]]
    assert fwd["dropout1"].input_shapes == [[2, 64, 12, 12]]
    assert fwd["fc1"].input_shapes == [[2, 9216]]
    assert fwd["fc1"].output_shapes == [[2, 128]]
    assert fwd["fc2"].output_shapes == [[2, 10]]
    assert fwd[""].input_shapes == [[2, 1, 28, 28]]
    assert fwd[""].output_shapes == [[2, 10]]
    assert all(e.input_dtypes == ["float32"] and e.output_dtypes == ["float32"]
               for e in fwd.values())
    assert not any(e.no_grad or e.recompute for e in fwd.values())
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    assert bwd["fc2"].grad_output_shapes == [[2, 10]]
    assert bwd["fc2"].grad_input_shapes == [[2, 128]]
    assert bwd["fc1"].grad_input_shapes == [[2, 9216]]
    assert bwd["conv2"].grad_input_shapes == [[2, 32, 26, 26]]
    assert bwd["conv2"].grad_output_shapes == [[2, 64, 24, 24]]
    # the data needs no gradient: conv1 and the root still get a backward, with no grad_input
    assert bwd["conv1"].grad_input_shapes == [None]
    assert bwd["conv1"].grad_output_shapes == [[2, 32, 26, 26]]
    assert bwd[""].grad_input_shapes == [None]
    assert all(e.grad_input_len == 1 and e.grad_output_len == 1 for e in bwd.values())


def test_mnist_step_numbering_over_three_steps(log_path: Path) -> None:
    mnist_steps(log_path, 3)
    steps = records_of(log_path, schema.Step)
    assert [(s.step, s.forward, s.backward) for s in steps] == [(0, 7, 7), (1, 7, 7), (2, 7, 7)]
    for step in range(3):
        assert names(log_path, "forward", step) == MNIST_FORWARD
        assert names(log_path, "backward", step) == MNIST_BACKWARD
        assert [e.call for e in events(log_path, step=step)] == [0] * 14
    assert [e.step for e in events(log_path)] == [0] * 14 + [1] * 14 + [2] * 14
    assert_pairing(log_path)
    assert_seq_increasing(log_path)
    # backward events of step 1 point at step 1's forward events, not step 0's
    fwd1 = {e.seq for e in events(log_path, "forward", 1)}
    assert {e.fwd for e in events(log_path, "backward", 1)} == fwd1
    # the step record closes each step: it follows the last event of that step in the file
    kinds = [(type(r).__name__, getattr(r, "step", None)) for r in read_log(log_path)
             if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent, schema.Step))]
    assert [k for k in kinds if k[0] == "Step"] == [("Step", 0), ("Step", 1), ("Step", 2)]
    assert kinds[14] == ("Step", 0) and kinds[29] == ("Step", 1) and kinds[44] == ("Step", 2)
    end = end_of(log_path)
    assert (end.status, end.events, end.steps, end.dropped, end.tracer_error) == (
        "ok", 42, 3, None, None)


def test_mnist_model_and_module_records(log_path: Path) -> None:
    mnist_steps(log_path, 1)
    models = records_of(log_path, schema.Model)
    assert [(m.model, m.cls) for m in models] == [(0, "Net")]
    modules = records_of(log_path, schema.Module)
    assert [(m.fqn, m.cls, m.params) for m in modules] == [
        ("", "Net", 0),
        ("conv1", "Conv2d", 32 * 9 + 32),
        ("conv2", "Conv2d", 64 * 32 * 9 + 64),
        ("dropout1", "Dropout", 0),
        ("dropout2", "Dropout", 0),
        ("fc1", "Linear", 9216 * 128 + 128),
        ("fc2", "Linear", 128 * 10 + 10),
    ]
    assert all(m.aliases is None for m in modules)


# -- nesting and repeated calls -----------------------------------------------------------------


def nested_seq() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 4),
        nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Tanh(), nn.Linear(4, 4))),
        nn.Linear(4, 2),
    )


def test_sequential_nesting(log_path: Path) -> None:
    model = nested_seq()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 4)).sum().backward()
    # forward: a parent's event (written when it returns) comes after all of its children
    assert names(log_path, "forward") == ["0", "1.0", "1.1.0", "1.1.1", "1.1", "1", "2", ""]
    # backward: a parent starts before its last child (they share the output tensor)
    assert names(log_path, "backward") == ["", "2", "1", "1.1", "1.1.1", "1.1.0", "1.0", "0"]
    assert_pairing(log_path)
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    assert bwd["1"].grad_input_shapes == [[2, 4]]
    assert bwd["0"].grad_input_shapes == [None]
    assert bwd[""].grad_input_shapes == [None]


def test_module_called_three_times(log_path: Path) -> None:
    class Thrice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.out = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.lin(torch.tanh(self.lin(self.lin(x)))))

    model = Thrice()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 3)).sum().backward()
    fwd = events(log_path, "forward")
    bwd = events(log_path, "backward")
    assert [(e.fqn, e.call) for e in fwd] == [
        ("lin", 0), ("lin", 1), ("lin", 2), ("out", 0), ("", 0)]
    assert [(e.fqn, e.call) for e in bwd] == [
        ("", 0), ("out", 0), ("lin", 2), ("lin", 1), ("lin", 0)]
    seq_of = {(e.fqn, e.call): e.seq for e in fwd}
    assert [e.fwd for e in bwd] == [seq_of[(e.fqn, e.call)] for e in bwd]
    assert [e.grad_input_shapes for e in bwd] == [[None], [[2, 3]], [[2, 3]], [[2, 3]], [None]]
    assert_pairing(log_path)


def test_leaf_input_reused_over_steps_gives_no_duplicates(log_path: Path) -> None:
    """A leaf input that requires grad gets tensor hooks; they must not pile up across steps."""
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    x = torch.randn(2, 3, requires_grad=True)
    with hooktrace.trace(log_path, model=model):
        for _ in range(3):
            model(x).sum().backward()
    for step in range(3):
        bwd = events(log_path, "backward", step)
        assert [(e.fqn, e.call) for e in bwd] == [("", 0), ("0", 1), ("1", 0), ("0", 0)]
        assert all(e.grad_input_shapes == [[2, 3]] for e in bwd)
    assert [(s.step, s.forward, s.backward) for s in records_of(log_path, schema.Step)] == [
        (0, 4, 4), (1, 4, 4), (2, 4, 4)]
    assert_pairing(log_path)


def test_retain_graph_second_backward_is_a_new_step(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    with hooktrace.trace(log_path, model=model):
        out = model(torch.randn(2, 3)).sum()
        out.backward(retain_graph=True)
        out.backward()
    fwd_seq = {e.fqn: e.seq for e in events(log_path, "forward")}
    for step in (0, 1):
        bwd = events(log_path, "backward", step)
        assert [e.fqn for e in bwd] == ["", "1", "0"]
        assert [e.fwd for e in bwd] == [fwd_seq[""], fwd_seq["1"], fwd_seq["0"]]
    assert [(s.step, s.forward, s.backward) for s in records_of(log_path, schema.Step)] == [
        (0, 3, 3), (1, 0, 3)]


def test_inplace_relu_same_events_as_out_of_place(tmp_path: Path) -> None:
    logs = []
    for inplace in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=inplace), nn.Linear(3, 2))
        path = tmp_path / f"inplace{inplace}.jsonl"
        with hooktrace.trace(path, model=model):
            model(torch.randn(2, 3)).sum().backward()
        logs.append([dataclasses.replace(e, seq=0) for e in events(path)])
        assert end_of(path).tracer_error is None
    assert logs[0] == logs[1]
    relu = [e for e in logs[1] if e.fqn == "1" and e.phase == "backward"]
    assert len(relu) == 1
    assert relu[0].grad_input_shapes == [[2, 3]]
    assert relu[0].grad_output_shapes == [[2, 3]]


# -- nested inputs and outputs ------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    scores: torch.Tensor
    extra: object
    hidden: torch.Tensor


Pair = collections.namedtuple("Pair", "p q")


class NestedIO(nn.Module):
    def forward(self, tup, lst, d, pair, nothing, *, mask, scale):  # type: ignore[no-untyped-def]
        assert nothing is None
        s = tup[0].sum() + lst[1].sum() + d["k"].sum() + pair.q.sum() + (scale * mask).sum()
        return Result(scores=s.expand(2, 3), extra=None, hidden=tup[1].double()), [None, d["k"] * 2]


def test_nested_inputs_and_outputs(log_path: Path) -> None:
    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, requires_grad=True)

    model = NestedIO()
    with hooktrace.trace(log_path, model=model):
        result, rest = model(
            (leaf(1, 2), leaf(3)),
            [leaf(4), leaf(5, 6)],
            {"k": leaf(7), "none": None},
            Pair(p=leaf(2, 2).half(), q=leaf(8)),
            None,
            mask=torch.ones(9, dtype=torch.bool),
            scale=leaf(9),
        )
        (result.scores.sum() + result.hidden.sum() + rest[1].sum()).backward()
    (fwd,) = events(log_path, "forward")
    assert fwd.fqn == ""
    # args leaves in order, then kwargs leaves in the order they were passed
    assert fwd.input_shapes == [[1, 2], [3], [4], [5, 6], [7], [2, 2], [8], [9], [9]]
    assert fwd.input_dtypes == ["float32"] * 5 + ["float16", "float32", "bool", "float32"]
    # dataclass fields (None skipped) then the list (None skipped)
    assert fwd.output_shapes == [[2, 3], [3], [7]]
    assert fwd.output_dtypes == ["float32", "float64", "float32"]
    assert fwd.inputs_more is None and fwd.outputs_more is None
    (bwd,) = events(log_path, "backward")
    assert bwd.fwd == fwd.seq
    assert bwd.grad_input_len == 9
    assert bwd.grad_output_len == 3
    # unused inputs (lst[0], pair.p) and the bool mask get None; the kwarg ``scale`` comes last
    assert bwd.grad_input_shapes == [[1, 2], [3], None, [5, 6], [7], None, [8], None, [9]]
    assert bwd.grad_output_shapes == [[2, 3], [3], [7]]


def test_tuple_output_partly_unused(log_path: Path) -> None:
    class Split(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x[:, :2], x[:, 2:]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 5)
            self.split = Split()
            self.head = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, b = self.split(self.lin(x))
            return self.head(b)

    model = Net()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 3)).sum().backward()
    assert names(log_path, "forward") == ["lin", "split", "head", ""]
    assert names(log_path, "backward") == ["", "head", "split", "lin"]
    split = next(e for e in events(log_path, "forward") if e.fqn == "split")
    assert split.output_shapes == [[2, 2], [2, 3]]
    bwd = next(e for e in events(log_path, "backward") if e.fqn == "split")
    assert bwd.grad_output_len == 2
    assert bwd.grad_output_shapes == [None, [2, 3]]
    assert bwd.grad_input_shapes == [[2, 5]]


def test_first_layer_without_input_grad_gets_backward(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 3)).sum().backward()
    bwd = events(log_path, "backward")
    assert [e.fqn for e in bwd] == ["", "1", "0"]
    first = bwd[2]
    assert (first.grad_input_len, first.grad_output_len) == (1, 1)
    assert first.grad_input_shapes == [None]
    assert first.grad_output_shapes == [[2, 4]]


def test_no_grad_and_eval_give_forward_only(log_path: Path) -> None:
    model = nested_seq().eval()
    with hooktrace.trace(log_path, model=model), torch.no_grad():
        model(torch.randn(2, 4))
        model(torch.randn(1, 4))
    fwd = events(log_path, "forward")
    order = ["0", "1.0", "1.1.0", "1.1.1", "1.1", "1", "2", ""]
    assert [e.fqn for e in fwd] == order + order
    assert [e.call for e in fwd] == [0] * 8 + [1] * 8
    assert all(e.no_grad for e in fwd)
    assert all(e.step == 0 for e in fwd)
    assert fwd[8].input_shapes == [[1, 4]]
    assert events(log_path, "backward") == []
    assert records_of(log_path, schema.Step) == []
    end = end_of(log_path)
    assert (end.status, end.events, end.steps, end.tracer_error) == ("ok", 16, 0, None)


@pytest.mark.parametrize("stats", [False, True])
def test_inference_mode_gives_forward_only(log_path: Path, stats: bool) -> None:
    model = nested_seq().eval()
    with hooktrace.trace(log_path, model=model, stats=stats), torch.inference_mode():
        model(torch.randn(2, 4))
        model(torch.randn(1, 4))
    end = end_of(log_path)
    assert end.tracer_error is None
    fwd = events(log_path, "forward")
    order = ["0", "1.0", "1.1.0", "1.1.1", "1.1", "1", "2", ""]
    assert [(e.fqn, e.call, e.no_grad) for e in fwd] == [
        (n, c, True) for c in (0, 1) for n in order]
    assert events(log_path, "backward") == []


def test_no_grad_flag_only_where_grad_is_off(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with hooktrace.trace(log_path, model=model):
        with torch.no_grad():
            model(torch.randn(2, 3))
        model(torch.randn(2, 3)).sum().backward()
    fwd = events(log_path, "forward")
    assert [(e.fqn, e.call, e.no_grad) for e in fwd] == [
        ("0", 0, True), ("1", 0, True), ("", 0, True),
        ("0", 1, False), ("1", 1, False), ("", 1, False)]
    bwd = events(log_path, "backward")
    assert [(e.fqn, e.call) for e in bwd] == [("", 1), ("1", 1), ("0", 1)]
    assert_pairing(log_path)


# -- several models, shared modules (global mode) -----------------------------------------------


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 5)
        self.enc = nn.Sequential(self.proj, nn.Tanh())
        self.dec = nn.Sequential(nn.Tanh(), self.proj)
        self.out = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dec(self.enc(x)))


def test_global_mode_several_models(log_path: Path) -> None:
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5))
    discriminator = Discriminator()
    adversarial_loss = nn.BCEWithLogitsLoss()
    with hooktrace.trace(log_path):
        fake = generator(torch.randn(2, 3))
        verdict = discriminator(fake)
        loss = adversarial_loss(verdict, torch.ones(2, 1))
        loss.backward()

    models = records_of(log_path, schema.Model)
    assert [(m.model, m.name, m.cls) for m in models] == [
        (0, "generator", "Sequential"),
        (1, "discriminator", "Discriminator"),
        (2, "adversarial_loss", "BCEWithLogitsLoss"),
    ]
    modules = records_of(log_path, schema.Module)
    # proj is also enc.0 and dec.1: each call is named by the parent that made it (issue 38),
    # those names' records say whose alias they are, and proj alone holds the parameters
    assert [(m.model, m.fqn, m.cls, m.params, m.aliases, m.alias_of) for m in modules] == [
        (0, "", "Sequential", 0, None, None),
        (0, "0", "Linear", 16, None, None),
        (0, "1", "ReLU", 0, None, None),
        (0, "2", "Linear", 25, None, None),
        (1, "", "Discriminator", 0, None, None),
        (1, "proj", "Linear", 30, ["enc.0", "dec.1"], None),
        (1, "enc", "Sequential", 0, None, None),
        (1, "enc.0", "Linear", 0, None, "proj"),
        (1, "enc.1", "Tanh", 0, None, None),
        (1, "dec", "Sequential", 0, None, None),
        (1, "dec.0", "Tanh", 0, None, None),
        (1, "dec.1", "Linear", 0, None, "proj"),
        (1, "out", "Linear", 6, None, None),
        (2, "", "BCEWithLogitsLoss", 0, None, None),
    ]
    fwd = events(log_path, "forward")
    assert [(e.model, e.fqn, e.call) for e in fwd] == [
        (0, "0", 0), (0, "1", 0), (0, "2", 0), (0, "", 0),
        (1, "enc.0", 0), (1, "enc.1", 0), (1, "enc", 0),
        (1, "dec.0", 0), (1, "dec.1", 0), (1, "dec", 0), (1, "out", 0), (1, "", 0),
        (2, "", 0),
    ]
    bwd = events(log_path, "backward")
    assert [(e.model, e.fqn, e.call) for e in bwd] == [
        (2, "", 0),
        (1, "", 0), (1, "out", 0), (1, "dec", 0), (1, "dec.1", 0), (1, "dec.0", 0),
        (1, "enc", 0), (1, "enc.1", 0), (1, "enc.0", 0),
        (0, "", 0), (0, "2", 0), (0, "1", 0), (0, "0", 0),
    ]
    assert_pairing(log_path)
    loss_bwd = bwd[0]
    assert loss_bwd.grad_input_len == 2
    assert loss_bwd.grad_input_shapes == [[2, 1], None]  # the target needs no gradient
    assert loss_bwd.grad_output_shapes == [[]]
    # the discriminator's input is the generator's output: it requires grad
    assert bwd[1].grad_input_shapes == [[2, 5]]
    assert bwd[9].grad_input_shapes == [None]


def test_model_list_traces_only_those(log_path: Path) -> None:
    a = nn.Linear(2, 2)
    b = nn.Sequential(nn.Linear(2, 2))
    other = nn.Linear(2, 2)
    with hooktrace.trace(log_path, model=[a, b]):
        out = other(b(a(torch.randn(1, 2))))
        out.sum().backward()
    assert [(m.model, m.cls) for m in records_of(log_path, schema.Model)] == [
        (0, "Linear"), (1, "Sequential")]
    assert [(e.model, e.fqn) for e in events(log_path, "forward")] == [
        (0, ""), (1, "0"), (1, "")]
    assert [(e.model, e.fqn) for e in events(log_path, "backward")] == [
        (1, ""), (1, "0"), (0, "")]
    assert [(s.step, s.forward, s.backward) for s in records_of(log_path, schema.Step)] == [
        (0, 3, 3)]


# -- activation checkpointing -------------------------------------------------------------------


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.a = nn.Linear(4, 4)
        self.blk = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        x = checkpoint(self.blk, x, use_reentrant=self.use_reentrant)
        return self.b(x)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_recompute(log_path: Path, use_reentrant: bool) -> None:
    torch.manual_seed(0)
    model = Checkpointed(use_reentrant)
    with hooktrace.trace(log_path, model=model):
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    end = end_of(log_path)
    assert (end.status, end.steps, end.tracer_error) == ("ok", 2, None)
    assert_pairing(log_path)
    assert_seq_increasing(log_path)
    logs = []
    for step in range(2):
        evs = events(log_path, step=step)
        first_bwd = next(i for i, e in enumerate(evs) if e.phase == "backward")
        # the first forward pass: no recompute
        assert [(e.fqn, e.recompute) for e in evs[:first_bwd]] == [
            ("a", False), ("blk.0", False), ("blk.1", False), ("blk", False), ("b", False),
            ("", False)]
        recomputed = [e for e in evs if e.phase == "forward" and e.recompute]
        assert recomputed, "the recompute inside backward was not recorded"
        # every recompute happens during backward, inside the checkpointed block
        assert all(evs.index(e) > first_bwd for e in recomputed)
        assert all(e.fqn.startswith("blk") for e in recomputed)
        assert all(not e.no_grad and e.call == 0 for e in recomputed)
        assert recomputed[0].fqn == "blk.0"
        assert recomputed[0].input_shapes == [[2, 4]]
        bwd = [e for e in evs if e.phase == "backward"]
        assert sorted(e.fqn for e in bwd) == sorted(["", "b", "blk", "blk.1", "blk.0", "a"])
        assert [e.fqn for e in bwd][:2] == ["", "b"]
        assert bwd[-1].fqn == "a"
        if use_reentrant:
            # the first pass ran under no_grad; backward goes through the recomputed calls
            assert [e.no_grad for e in evs[:first_bwd]] == [False, True, True, True, False, False]
            assert [(e.fqn, e.recompute) for e in evs[first_bwd:]] == [
                ("", False), ("b", False),
                ("blk.0", True), ("blk.1", True), ("blk", True),
                ("blk", True), ("blk.1", True), ("blk.0", True),
                ("a", False)]
        else:
            # backward uses the original graph: its events pair with the first-pass calls
            assert [e.fqn for e in bwd] == ["", "b", "blk", "blk.1", "blk.0", "a"]
            assert not any(e.recompute for e in bwd)
        logs.append([(e.phase, e.fqn, e.call, e.recompute, e.step - step) for e in evs])
    assert logs[0] == logs[1]


# -- filters ------------------------------------------------------------------------------------


def test_include_exclude(log_path: Path) -> None:
    model = nested_seq()
    with hooktrace.trace(log_path, model=model, include=("1*",), exclude=("1.1.*",)):
        model(torch.randn(2, 4)).sum().backward()
    assert names(log_path, "forward") == ["1.0", "1.1", "1"]
    assert names(log_path, "backward") == ["1", "1.1", "1.0"]
    assert_pairing(log_path)
    header = read_log(log_path)[0]
    assert isinstance(header, schema.Header)
    assert header.options["include"] == ["1*"]
    assert header.options["exclude"] == ["1.1.*"]
    assert [(s.step, s.forward, s.backward) for s in records_of(log_path, schema.Step)] == [
        (0, 3, 3)]


def test_exclude_only(log_path: Path) -> None:
    model = nested_seq()
    with hooktrace.trace(log_path, model=model, exclude=("", "1.*")):
        model(torch.randn(2, 4)).sum().backward()
    assert names(log_path, "forward") == ["0", "1", "2"]
    assert names(log_path, "backward") == ["2", "1", "0"]


def test_steps_filter(log_path: Path) -> None:
    model = nested_seq()
    with hooktrace.trace(log_path, model=model, steps="1:2"):
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward()
    evs = events(log_path)
    assert len(evs) == 16
    assert all(e.step == 1 for e in evs)
    assert names(log_path, "forward", 1) == ["0", "1.0", "1.1.0", "1.1.1", "1.1", "1", "2", ""]
    assert names(log_path, "backward", 1) == ["", "2", "1", "1.1", "1.1.1", "1.1.0", "1.0", "0"]
    assert [(s.step, s.forward, s.backward) for s in records_of(log_path, schema.Step)] == [
        (1, 8, 8)]
    assert_pairing(log_path)
    end = end_of(log_path)
    assert end.events == 16
    assert read_log(log_path)[0].options["steps"] == "1:2"


def test_max_events(log_path: Path) -> None:
    model = nested_seq()
    with hooktrace.trace(log_path, model=model, max_events=5):
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    evs = events(log_path)
    assert [(e.phase, e.fqn) for e in evs] == [
        ("forward", "0"), ("forward", "1.0"), ("forward", "1.1.0"), ("forward", "1.1.1"),
        ("forward", "1.1")]
    end = end_of(log_path)
    assert end.status == "ok"
    assert end.events == 5
    assert end.dropped is not None and end.dropped > 0
    assert end.tracer_error is None
    assert read_log(log_path)[0].options["max_events"] == 5


# -- agreement with register_full_backward_hook ----------------------------------------------------


class SplitHead(nn.Module):
    """A tuple output; the second half is not used downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y[:, :3], y[:, 3:]


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 6)
        self.act = nn.GELU()
        self.split = SplitHead()
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.split(self.act(self.fc(x)))
        return self.head(a)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_mlp() -> tuple[nn.Module, torch.Tensor]:
    return (nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 2)), torch.randn(2, 6))


def make_conv() -> tuple[nn.Module, torch.Tensor]:
    return ConvNet(), torch.randn(2, 1, 12, 12)


def make_conv_input_grad() -> tuple[nn.Module, torch.Tensor]:
    return ConvNet(), torch.randn(2, 1, 12, 12, requires_grad=True)


def make_tuple() -> tuple[nn.Module, torch.Tensor]:
    return TupleNet(), torch.randn(2, 5)


def _shapes(grads: tuple[torch.Tensor | None, ...]) -> list[list[int] | None]:
    return [None if g is None else list(g.shape) for g in grads]


def full_hook_reference(model: nn.Module, x: torch.Tensor) -> tuple[list[str], dict]:
    """The order in which backward starts (full pre-hooks), and name -> grad lens and shapes
    (full hooks)."""
    started: list[str] = []
    seen: dict[str, tuple] = {}
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_full_backward_pre_hook(
            lambda m, go, name=name: started.append(name)))
        handles.append(module.register_full_backward_hook(
            lambda m, gi, go, name=name: seen.__setitem__(
                name, (len(gi), len(go), _shapes(gi), _shapes(go)))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no inputs require gradients" for the first layer
        model(x).sum().backward()
    for h in handles:
        h.remove()
    return started, seen


@pytest.mark.parametrize("make", [make_mlp, make_conv, make_conv_input_grad, make_tuple])
def test_agrees_with_full_backward_hooks(log_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = make()
    reference_model = copy.deepcopy(model)
    x_ref = x.detach().clone().requires_grad_(x.requires_grad)
    started, seen = full_hook_reference(reference_model, x_ref)

    with hooktrace.trace(log_path, model=model):
        model(x).sum().backward()
    bwd = events(log_path, "backward")
    assert [e.call for e in bwd] == [0] * len(bwd)
    assert [e.fqn for e in bwd] == started
    assert {e.fqn for e in bwd} == set(seen) == {n for n, _ in model.named_modules()}
    ours = {e.fqn: (e.grad_input_len, e.grad_output_len, e.grad_input_shapes,
                     e.grad_output_shapes) for e in bwd}
    assert ours == seen
    # and identical parameter gradients: the hooks changed nothing
    for (n, p), (_, q) in zip(model.named_parameters(), reference_model.named_parameters(),
                                      strict=True):
        assert torch.equal(p.grad, q.grad), n


def test_identity_on_leaf_input_agrees_with_full_hook(log_path: Path) -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(3, 2))
    x = torch.randn(2, 3, requires_grad=True)
    _, seen = full_hook_reference(copy.deepcopy(model), x.detach().clone().requires_grad_())
    assert seen["0"] == (1, 1, [[2, 3]], [[2, 3]])
    with hooktrace.trace(log_path, model=model):
        model(x).sum().backward()
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    assert bwd["0"].grad_output_shapes == [[2, 3]]
    assert bwd["0"].grad_input_shapes == [[2, 3]]


# -- double backward ----------------------------------------------------------------------------


def test_double_backward_gradient_penalty(log_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    x = torch.randn(2, 4)

    def step(m: nn.Module) -> torch.Tensor:
        xi = x.clone().requires_grad_()
        out = m(xi)
        (g,) = torch.autograd.grad(out.sum(), xi, create_graph=True)
        loss = out.mean() + ((g.norm(2, dim=1) - 1) ** 2).mean()
        loss.backward()
        return loss.detach()

    expected = step(reference)
    with hooktrace.trace(log_path, model=model):
        got = step(model)
    assert torch.equal(got, expected)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    end = end_of(log_path)
    assert (end.status, end.tracer_error) == ("ok", None)
    assert names(log_path, "forward") == ["0", "1", "2", ""]
    # autograd.grad is a backward pass of its own (step 0), loss.backward() is step 1
    assert end.steps == 2
    assert names(log_path, "backward", 0) == ["", "2", "1", "0"]
    assert names(log_path, "backward", 1) == ["", "2", "1", "0"]
    assert_pairing(log_path)
    assert [e.grad_input_shapes for e in events(log_path, "backward", 0)] == [
        [[2, 4]], [[2, 8]], [[2, 8]], [[2, 4]]]
    assert [e.grad_output_shapes for e in events(log_path, "backward", 1)] == [
        [[2, 1]], [[2, 1]], [[2, 8]], [[2, 8]]]


def test_second_backward_keeps_leaf_grad_input(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    x = torch.randn(2, 3, requires_grad=True)
    with hooktrace.trace(log_path, model=model):
        out = model(x).sum()
        out.backward(retain_graph=True)
        out.backward()
    assert x.grad is not None
    for step in (0, 1):
        bwd = events(log_path, "backward", step)
        assert [(e.fqn, e.grad_input_shapes) for e in bwd] == [
            ("", [[2, 3]]), ("1", [[2, 3]]), ("0", [[2, 3]])]

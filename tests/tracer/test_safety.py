"""Tracing never changes the program: same numbers, no hooks left behind, exceptions untouched."""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision.models as tvm
from helpers import events, names, read_log
from torch import nn
from torch.nn.modules import module as nn_module

import hooktrace
from hooktrace.log import schema


def end_of(path: Path) -> schema.End:
    records = read_log(path)
    assert isinstance(records[-1], schema.End)
    assert sum(isinstance(r, schema.End) for r in records) == 1
    return records[-1]


def global_hooks() -> dict[str, int]:
    return {
        "forward": len(nn_module._global_forward_hooks),
        "forward_pre": len(nn_module._global_forward_pre_hooks),
        "forward_always_called": len(nn_module._global_forward_hooks_always_called),
        "backward": len(nn_module._global_backward_hooks),
        "backward_pre": len(nn_module._global_backward_pre_hooks),
    }


NO_GLOBAL_HOOKS = {"forward": 0, "forward_pre": 0, "forward_always_called": 0,
                   "backward": 0, "backward_pre": 0}


def assert_no_hooks(*models: nn.Module) -> None:
    assert global_hooks() == NO_GLOBAL_HOOKS
    for model in models:
        for name, m in model.named_modules():
            assert not m._forward_hooks, name
            assert not m._forward_pre_hooks, name
            assert not m._backward_hooks, name
            assert not m._backward_pre_hooks, name
            assert not m._forward_hooks_with_kwargs, name
            assert not m._forward_hooks_always_called, name


@pytest.fixture(autouse=True)
def _clean_before() -> None:
    # another test leaking hooks would make these tests meaningless
    assert global_hooks() == NO_GLOBAL_HOOKS


# -- bit-identical results ----------------------------------------------------------------------


def train_resnet18(path: Path | None, steps: int = 2) -> tuple[list[torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    model = tvm.resnet18(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    inputs = [torch.randn(2, 3, 64, 64) for _ in range(steps)]
    targets = [torch.randint(0, 1000, (2,)) for _ in range(steps)]
    outputs = []

    def run() -> None:
        for x, t in zip(inputs, targets, strict=True):
            optimizer.zero_grad()
            out = model(x)
            nn.functional.cross_entropy(out, t).backward()
            outputs.append(out.detach())
            if len(outputs) < steps:  # keep the last step's gradients to compare
                optimizer.step()

    if path is None:
        run()
    else:
        with hooktrace.trace(path, model=model):
            run()
    return outputs, model


def test_resnet18_bit_identical(log_path: Path) -> None:
    plain_out, plain = train_resnet18(None)
    traced_out, traced = train_resnet18(log_path)
    assert len(traced_out) == len(plain_out) == 2
    for a, b in zip(plain_out, traced_out, strict=True):
        assert torch.equal(a, b)
    plain_params = dict(plain.named_parameters())
    for name, p in traced.named_parameters():
        q = plain_params[name]
        assert p.grad is not None and q.grad is not None, name
        assert torch.equal(p, q), name
        assert torch.equal(p.grad, q.grad), name
    plain_buffers = dict(plain.named_buffers())
    for name, b in traced.named_buffers():
        assert torch.equal(b, plain_buffers[name]), name
    # and the trace did record both steps
    end = end_of(log_path)
    assert (end.status, end.steps, end.tracer_error) == ("ok", 2, None)
    assert len(events(log_path, "backward", 1)) == len(events(log_path, "forward", 1))
    assert_no_hooks(traced)


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5),
                                  nn.Linear(32, 32), nn.Dropout(0.3))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.dropout(self.body(x), 0.2, self.training))


def run_dropnet(path: Path | None) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(3)
    model = DropNet()
    torch.manual_seed(4)
    x = torch.randn(2, 16, requires_grad=True)

    def step() -> torch.Tensor:
        out = model(x)
        out.pow(2).sum().backward()
        return out.detach()

    if path is None:
        out = step()
    else:
        with hooktrace.trace(path, model=model):
            out = step()
    assert x.grad is not None
    grads = [p.grad for p in model.parameters()] + [x.grad]
    return out, grads, torch.get_rng_state()  # type: ignore[return-value]


def test_dropout_model_bit_identical(log_path: Path) -> None:
    out_a, grads_a, rng_a = run_dropnet(None)
    out_b, grads_b, rng_b = run_dropnet(log_path)
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b) == 7
    for g, h in zip(grads_a, grads_b, strict=True):
        assert torch.equal(g, h)
    # the tracer draws no random numbers
    assert torch.equal(rng_a, rng_b)
    assert names(log_path, "forward") == ["body.0", "body.1", "body.2", "body.3", "body.4", "body",
                                          "head", ""]


# -- no hooks left behind -----------------------------------------------------------------------


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Sequential(nn.Linear(4, 2)))


@pytest.mark.parametrize("scoped", [True, False])
def test_no_hooks_after_exit(log_path: Path, scoped: bool) -> None:
    model = small_model()
    x = torch.randn(2, 4, requires_grad=True)
    with hooktrace.trace(log_path, model=model if scoped else None):
        assert global_hooks() != NO_GLOBAL_HOOKS  # the tracer is really hooked in
        model(x).sum().backward()
        model(x)  # a forward with no backward leaves gradient hooks on a leaf input
    assert_no_hooks(model)
    assert not x._backward_hooks  # the tensor hooks on the leaf input are gone too
    assert end_of(log_path).status == "ok"


def test_no_global_hook_bookkeeping_left(log_path: Path) -> None:
    before = dict(nn_module._global_forward_hooks_with_kwargs)
    model = small_model()
    with hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 4)).sum().backward()
    assert dict(nn_module._global_forward_hooks_with_kwargs) == before


class Boom(RuntimeError):
    pass


class Exploding(nn.Module):
    def __init__(self, message: str = "kaboom: shape [2, 4] is wrong") -> None:
        super().__init__()
        self.ok = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.message = message
        self.raised: list[Boom] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inner(self.ok(x))
        self.raised.append(Boom(self.message))
        raise self.raised[-1]


def raised_at(statement: str) -> dict[str, Any]:
    """The end record's ``file`` and ``line`` for an error raised by ``statement`` in this file
    (the innermost line of the user's code it came through)."""
    lines = Path(__file__).read_text().splitlines()
    [line] = [i + 1 for i, text in enumerate(lines) if text.strip() == statement]
    return {"file": os.path.relpath(__file__), "line": line}


def test_no_hooks_after_exception(log_path: Path) -> None:
    model = small_model()
    with pytest.raises(ValueError, match=r"^user code failed$"), hooktrace.trace(
            log_path, model=model):
        model(torch.randn(2, 4)).sum().backward()
        raise ValueError("user code failed")
    assert_no_hooks(model)
    end = end_of(log_path)
    assert end.status == "error"
    assert end.error == {"type": "ValueError", "message": "user code failed",
                         **raised_at('raise ValueError("user code failed")')}
    assert end.steps == 1
    assert end.events == 10
    assert end.tracer_error is None


def test_module_exception_propagates_unchanged(log_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), Exploding())
    raised = Boom("kaboom: shape [2, 4] is wrong")
    with pytest.raises(Boom) as info, hooktrace.trace(log_path):
        model(torch.randn(2, 4, requires_grad=True))
    assert info.value is model[1].raised[0]  # the very object raised, not a re-wrapped copy
    assert type(info.value) is Boom
    assert str(info.value) == str(raised)
    assert info.value.args == raised.args
    assert info.value.__cause__ is None
    # raised in Exploding.forward, not somewhere in the tracer
    assert info.traceback[-1].name == "forward"
    assert_no_hooks(model)
    end = end_of(log_path)
    assert end.status == "error"
    assert end.error == {"type": "Boom", "message": "kaboom: shape [2, 4] is wrong",
                         "model": 0, "module": "1", **raised_at("raise self.raised[-1]")}
    assert end.tracer_error is None
    # the calls that returned before the exception were recorded
    assert names(log_path, "forward") == ["0", "1.ok", "1.inner.0", "1.inner.1", "1.inner"]


def test_exception_caught_inside_trace_keeps_tracing_right(log_path: Path) -> None:
    bad = nn.Sequential(nn.Linear(4, 4), Exploding())
    good = small_model()
    with hooktrace.trace(log_path, model=[bad, good]):
        for _ in range(2):
            with contextlib.suppress(Boom):
                bad(torch.randn(2, 4))
        good(torch.randn(2, 4)).sum().backward()
    end = end_of(log_path)
    assert (end.status, end.error, end.tracer_error) == ("ok", None, None)
    good_fwd = [e.fqn for e in events(log_path, "forward") if e.model == 1]
    assert good_fwd == ["0", "1", "2.0", "2", ""]
    assert [(e.model, e.fqn) for e in events(log_path, "backward")] == [
        (1, ""), (1, "2"), (1, "2.0"), (1, "1"), (1, "0")]
    bad_fwd = [(e.fqn, e.call) for e in events(log_path, "forward") if e.model == 0]
    assert bad_fwd == [("0", 0), ("1.ok", 0), ("1.inner.0", 0), ("1.inner.1", 0), ("1.inner", 0),
                       ("0", 1), ("1.ok", 1), ("1.inner.0", 1), ("1.inner.1", 1), ("1.inner", 1)]
    assert_no_hooks(bad, good)


def test_exception_in_backward_propagates(log_path: Path) -> None:
    class FailingGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x.clone()

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            raise Boom("no gradient for you")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(FailingGrad.apply(self.a(x)))

    model = Net()
    with pytest.raises(Boom, match=r"^no gradient for you$"), hooktrace.trace(
            log_path, model=model):
        model(torch.randn(2, 3)).sum().backward()
    assert_no_hooks(model)
    end = end_of(log_path)
    assert end.status == "error"
    assert end.error == {"type": "Boom", "message": "no gradient for you",
                         **raised_at('raise Boom("no gradient for you")')}
    assert end.tracer_error is None
    # the backward that had started is still written
    assert names(log_path, "backward") == ["", "b"]


def test_keyboard_interrupt_is_interrupted(log_path: Path) -> None:
    model = small_model()
    with pytest.raises(KeyboardInterrupt), hooktrace.trace(log_path, model=model):
        model(torch.randn(2, 4))
        raise KeyboardInterrupt
    assert_no_hooks(model)
    assert end_of(log_path).status == "interrupted"


def test_backward_after_exit_records_nothing_and_works(log_path: Path) -> None:
    model = small_model()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 4)
    with hooktrace.trace(log_path, model=model):
        out = model(x)
    size = log_path.stat().st_size
    out.sum().backward()  # the graph still carries the tracer's node hooks: they must be inert
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert log_path.stat().st_size == size
    assert events(log_path, "backward") == []
    assert end_of(log_path).steps == 0


# -- several traces in one process --------------------------------------------------------------


def test_second_trace_in_same_process(tmp_path: Path) -> None:
    model = small_model()
    x = torch.randn(2, 4)
    logs = []
    for i in range(2):
        path = tmp_path / f"trace{i}.jsonl"
        model.zero_grad()
        with hooktrace.trace(path, model=model):
            model(x).sum().backward()
        assert_no_hooks(model)
        logs.append([r for r in read_log(path) if not isinstance(r, schema.Header)])
    assert logs[0] == logs[1]
    assert [e.fqn for e in logs[1] if isinstance(e, schema.BackwardEvent)] == [
        "", "2", "2.0", "1", "0"]
    assert [r for r in logs[1] if isinstance(r, schema.Model)] == [
        schema.Model(model=0, name="model", cls="Sequential")]


def test_second_global_trace_after_scoped_one(tmp_path: Path) -> None:
    model = small_model()
    with hooktrace.trace(tmp_path / "a.jsonl", model=model):
        model(torch.randn(2, 4)).sum().backward()
    with hooktrace.trace(tmp_path / "b.jsonl"):
        model(torch.randn(2, 4)).sum().backward()
    assert names(tmp_path / "a.jsonl", "forward") == names(tmp_path / "b.jsonl", "forward") == [
        "0", "1", "2.0", "2", ""]
    assert names(tmp_path / "b.jsonl", "backward") == ["", "2", "2.0", "1", "0"]
    assert_no_hooks(model)


def test_trace_object_cannot_be_started_twice(log_path: Path) -> None:
    session = hooktrace.trace(log_path)
    with session:
        pass
    with pytest.raises(RuntimeError):
        session.start()
    assert global_hooks() == NO_GLOBAL_HOOKS
    assert end_of(log_path).status == "ok"


# -- a long run ---------------------------------------------------------------------------------


class _FreshLayer(nn.Module):
    """A model that builds a new Linear inside its forward on every step (a habit seen in the
    wild): each step meets modules the tracer has not seen before."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.Linear(8, 8)(torch.relu(self.a(x))))


def _tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize("steps", ["0:10", "all"])
def test_a_long_run_holds_no_more_objects(log_path: Path, steps: str) -> None:
    """Thousands of steps: what the tracer keeps does not grow with them, and after the
    recorded steps (the default) the log does not grow either."""
    torch.manual_seed(0)
    model = _FreshLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])

    def train(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    with hooktrace.trace(log_path, steps=steps):
        train(50)
        objects, size = _tracked_objects(), log_path.stat().st_size
        train(1000)
        grown = _tracked_objects() - objects
        assert grown < 50, f"{grown} more objects alive after 1000 more steps"
        if steps == "0:10":
            assert log_path.stat().st_size == size
        else:
            assert log_path.stat().st_size > size
    assert end_of(log_path).steps == 1050


def test_a_meta_device_pass_leaves_tracing_on(log_path: Path) -> None:
    """A forward and backward on the meta device (shapes only, no numbers: a shape or FLOP
    count before training) is traced without statistics, and the real steps after it in full."""
    with hooktrace.trace(log_path):
        with torch.device("meta"):
            shapes_only = small_model()
            shapes_only(torch.randn(2, 4)).sum().backward()
        model = small_model()
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    end = end_of(log_path)
    assert (end.status, end.steps, end.tracer_error) == ("ok", 3, None)
    for step in range(3):
        backward = [e for e in events(log_path, "backward", step)
                    if isinstance(e, schema.BackwardEvent)]
        assert len(backward) == 5
        stats = [s for e in backward for s in e.grad_output_stats or []]
        if step == 0:
            assert stats == [None] * 5
        else:
            assert all(s is not None and s[0] > 0 for s in stats), stats


def test_a_fake_tensor_pass_leaves_tracing_on(log_path: Path) -> None:
    """A forward on fake tensors (FakeTensorMode: shapes only, as torch.export and FLOP
    counters use) is traced without statistics, and the real steps after it in full."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = small_model()
    with hooktrace.trace(log_path):
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            assert model(mode.from_tensor(torch.randn(2, 4))).shape == (2, 2)
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    end = end_of(log_path)
    assert (end.status, end.steps, end.tracer_error) == ("ok", 2, None)
    forward = [e for e in events(log_path, "forward", 0) if isinstance(e, schema.ForwardEvent)]
    assert [e.fqn for e in forward] == ["0", "1", "2.0", "2", ""] * 2  # fake, then real
    backward = [e for e in events(log_path, "backward", 1) if isinstance(e, schema.BackwardEvent)]
    assert all(s is not None and s[0] > 0 for e in backward for s in e.grad_output_stats or [])

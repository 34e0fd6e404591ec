"""Every loss term counts (``hooktrace/observe/loss.py``, ``check/lossterms.py``): a term
added into the loss that carries no gradient is named with what cut it and its line; how much
of its batch a classification loss reads is a fact. Traced in this process on real models: each
bug next to the healthy recipe it resembles, which stays silent."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import read_log
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.log import schema

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def run(path: Path | None, loss_fn: Loss, steps: int = 2) -> list[torch.Tensor]:
    """Trains an MLP ``steps`` steps with ``loss_fn`` (traced into ``path`` unless None); its
    weights after."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    with hooktrace.trace(path) if path is not None else nullcontext():
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def cuts(path: Path) -> list[dict[str, Any]]:
    return [r.detail for r in read_log(path)
            if isinstance(r, schema.Signal) and r.kind == "loss-term-cut"]


def line_of(fn: Callable[..., Any], text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# -- the bugs: a term that reaches nothing trainable ------------------------------------------

def detached(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    distill = F.mse_loss(out.detach().softmax(1), torch.full_like(out, 0.25))
    return F.cross_entropy(out, y) + 10.0 * distill


def under_no_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    with torch.no_grad():
        smooth = (out[1:] - out[:-1]).abs().mean()
    return F.cross_entropy(out, y) + smooth


def max_under_no_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    with torch.no_grad():
        peak = out.max(1).values.mean()  # a (values, indices) pair, then its values
    return F.cross_entropy(out, y) + peak


def through_numpy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    spread = np.asarray(out.softmax(1).detach().numpy().std(), dtype=np.float32)
    return F.cross_entropy(out, y) + torch.from_numpy(spread)


def through_item(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    norm = out.pow(2).mean().item()
    return F.cross_entropy(out, y) + torch.tensor(norm)


def through_argmax(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    wrong = (out.argmax(1) != y).float().mean()
    return torch.stack([F.cross_entropy(out, y), wrong]).sum()


BUGS: dict[str, tuple[Loss, str, str, str]] = {  # the reason, the op, the line's text
    "detached": (detached, "detach", "Tensor.detach", "out.detach()"),
    "under_no_grad": (under_no_grad, "no_grad", "Tensor.sub", "out[1:] - out[:-1]"),
    "max_under_no_grad": (max_under_no_grad, "no_grad", "Tensor.max", "out.max(1)"),
    "through_numpy": (through_numpy, "numpy", "Tensor.numpy", ".numpy()"),
    "through_item": (through_item, "item", "Tensor.item", ".item()"),
    "through_argmax": (through_argmax, "op", "Tensor.argmax", "out.argmax(1)"),
}


@pytest.mark.parametrize("case", sorted(BUGS))
def test_a_term_without_gradient_is_named_with_its_cut(tmp_path: Path, case: str) -> None:
    loss_fn, reason, op, text = BUGS[case]
    path = tmp_path / "log.jsonl"
    run(path, loss_fn)
    [found] = cuts(path)  # once, though both steps cut it
    assert (found["reason"], found["op"]) == (reason, op)
    assert found["file"].endswith("test_loss_terms.py")
    assert found["line"] == line_of(loss_fn, text)
    assert found["added_line"] == line_of(loss_fn, "return")
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.model, problem.module, problem.step) == \
        ("loss-term-cut", "model", "", 0)
    assert f"test_loss_terms.py:{found['line']}" in problem.message
    assert "in the loss, outside every forward" in problem.message
    assert problem.source is None  # not the model's forward: the loss's own line


# -- healthy look-alikes: a constant that never had a gradient, a detached target -------------

def accumulated(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    total = torch.zeros(())
    for part in (out[:3], out[3:]):
        total = total + F.cross_entropy(part, y[: len(part)])
    return total


def accumulated_in_place(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    total = torch.tensor(0.0)
    out = model(x)
    total += F.cross_entropy(out, y)
    return total + 1.0


def numpy_metric_and_accumulator(model: nn.Module, x: torch.Tensor, y: torch.Tensor
                                 ) -> torch.Tensor:
    out = model(x)
    accuracy = (out.detach().numpy().argmax(1) == y.numpy()).mean()  # only logged
    total = torch.zeros(())
    return total + F.cross_entropy(out, y) * float(1.0 + 0.0 * accuracy)


ZERO = torch.zeros(())  # an accumulator made before any model call: outside the window


def numpy_metric_and_early_accumulator(model: nn.Module, x: torch.Tensor, y: torch.Tensor
                                       ) -> torch.Tensor:
    out = model(x)
    accuracy = (out.detach().numpy().argmax(1) == y.numpy()).mean()  # only logged
    assert accuracy >= 0
    return ZERO + F.cross_entropy(out, y)


def detached_target(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    with torch.no_grad():
        teacher = mlp(3)(x).softmax(1)  # a model with trainable weights, run without gradient
    consistency = F.mse_loss(out.softmax(1), out.detach().roll(1, 0).softmax(1))
    return F.cross_entropy(out, y) + F.kl_div(out.log_softmax(1), teacher,
                                              reduction="batchmean") + consistency


def weight_from_numpy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    weight = torch.from_numpy(1.0 + (y.numpy() % 2).astype(np.float32))
    out = model(x)
    logged = out.detach().abs().mean()  # a metric, never added
    return (F.cross_entropy(out, y, reduction="none") * weight).mean() + 0.0 * logged.item()


def straight_through(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    hard = out + (out.round() - out).detach()  # an addition below the loss, not a term of it
    return F.cross_entropy(hard, y) + F.cross_entropy(out, y)


HEALTHY: dict[str, Loss] = {
    "accumulated": accumulated, "accumulated_in_place": accumulated_in_place,
    "numpy_metric_and_accumulator": numpy_metric_and_accumulator,
    "numpy_metric_and_early_accumulator": numpy_metric_and_early_accumulator,
    "detached_target": detached_target, "weight_from_numpy": weight_from_numpy,
    "straight_through": straight_through,
}


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_healthy_look_alikes_are_silent(tmp_path: Path, case: str) -> None:
    path = tmp_path / "log.jsonl"
    run(path, HEALTHY[case])
    assert cuts(path) == []
    assert run_checks(path).problems == []


# -- how much of the batch a loss reads -------------------------------------------------------

def test_the_share_of_targets_a_loss_reads_is_a_fact(tmp_path: Path) -> None:
    def padded(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        return F.cross_entropy(out, torch.where(torch.arange(6) < 4, y, -100))

    path = tmp_path / "log.jsonl"
    run(path, padded)
    shares = [r for r in read_log(path) if isinstance(r, schema.Signal) and r.kind == "loss-share"]
    assert [(s.step, s.detail["read"], s.detail["of"], s.detail["ignore_index"])
            for s in shares] == [(0, 4, 6, -100), (1, 4, 6, -100)]
    report = run_checks(path)
    assert report.problems == []
    [note] = [f for f in report.findings if f.cause == "loss-share"]
    assert "4 of 6 targets" in note.message and note.severity == "note"


def test_a_loss_that_ignores_every_target_is_a_finding(tmp_path: Path) -> None:
    def all_ignored(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        return F.cross_entropy(out, torch.full_like(y, 255), ignore_index=255) + \
            F.cross_entropy(out, y)

    path = tmp_path / "log.jsonl"
    run(path, all_ignored)
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.model, problem.step) == ("loss-reads-nothing", "model", 0)
    assert "every target" in problem.message and "ignore_index=255" in problem.message


def test_a_loss_reading_its_whole_batch_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    run(path, lambda model, x, y: F.cross_entropy(model(x), y))
    assert [r for r in read_log(path) if isinstance(r, schema.Signal)
            and r.kind in ("loss-share", "loss-term-cut")] == []
    assert run_checks(path).findings == []


# -- tracing changes nothing --------------------------------------------------------------------

@pytest.mark.parametrize("case", ["detached", "through_numpy", "through_item"])
def test_tracing_changes_nothing(tmp_path: Path, case: str) -> None:
    loss_fn = BUGS[case][0]
    untraced, traced = run(None, loss_fn, 3), run(tmp_path / "log.jsonl", loss_fn, 3)
    assert all(torch.equal(a, b) for a, b in zip(untraced, traced, strict=True))
    assert torch._C._len_torch_function_stack() == 0  # the window is off torch's stack
    assert torch.Tensor.backward.__module__ == "torch._tensor"  # put back


# -- a bootstrapped target computed with gradient ---------------------------------------------

def q_learning(path: Path, target_of: Callable[[nn.Module, torch.Tensor, torch.Tensor],
                                               torch.Tensor]) -> None:
    q = mlp()
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    torch.manual_seed(2)
    s, s2, a, r = torch.randn(6, 8), torch.randn(6, 8), torch.randint(0, 4, (6,)), torch.randn(6)
    with hooktrace.trace(path):
        for _ in range(2):
            opt.zero_grad()
            pred = q(s).gather(1, a[:, None]).squeeze(1)
            F.mse_loss(pred, target_of(q, s2, r)).backward()
            opt.step()


def test_a_target_with_gradient_through_a_max_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    q_learning(path, lambda q, s2, r: r + 0.99 * q(s2).max(1).values)
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.model, problem.module, problem.step) == \
        ("loss-target-grad", "q", "", 0)
    assert problem.evidence["through"] == "Max" and problem.evidence["loss"] == "F.mse_loss"
    assert "no_grad" in problem.hint and problem.source is None


@pytest.mark.parametrize("target", ["detached", "no_grad", "consistency", "same_call"])
def test_targets_that_are_fine_are_silent(tmp_path: Path, target: str) -> None:
    def target_of(q: nn.Module, s2: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        if target == "detached":
            return r + 0.99 * q(s2).max(1).values.detach()
        if target == "no_grad":
            with torch.no_grad():
                return r + 0.99 * q(s2).max(1).values
        if target == "consistency":  # a second call, with gradient, but no max: Pi-model style
            return q(s2).softmax(1)[:, 0]
        return q(s2).max(1).values  # the prediction's own call on the same inputs below

    path = tmp_path / "log.jsonl"
    if target == "same_call":
        q = mlp()
        x = torch.randn(6, 8)
        with hooktrace.trace(path):
            out = q(x)
            F.mse_loss(out.mean(1), out.max(1).values).backward()
    else:
        q_learning(path, target_of)
    assert run_checks(path).problems == []


def test_a_mode_the_program_pushed_keeps_its_place(tmp_path: Path) -> None:
    # the model called inside ``with torch.device(...)`` (a TorchFunctionMode), the loss after
    # it: the program's exit pops its own mode, not the window
    model = mlp()
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    with hooktrace.trace(tmp_path / "log.jsonl"):
        for _ in range(2):
            with torch.device("cpu"):
                out = model(x)
            assert torch._C._len_torch_function_stack() == 0
            F.cross_entropy(out, y).backward()
    assert torch._C._len_torch_function_stack() == 0


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 16)
        self.cls = nn.Linear(16, 4)
        self.reg = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.body(x))
        return self.cls(h), self.reg(h)


def test_a_head_cut_in_the_loss_is_said_to_be_in_the_loss(tmp_path: Path) -> None:
    """Issue 36, item 6: the head whose output the loss turns into a number starves; that is
    said in the loss, at its line, not as a gradient stopping inside the model's forward."""
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y, t = torch.randn(6, 8), torch.randint(0, 4, (6,)), torch.randn(6, 1)
    path = tmp_path / "log.jsonl"
    with hooktrace.trace(path):
        for _ in range(2):
            opt.zero_grad()
            logits, value = model(x)
            aux = F.mse_loss(value, t).item()
            (F.cross_entropy(logits, y) + torch.tensor(aux)).backward()
            opt.step()
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.module, problem.evidence["starved"]) == \
        ("loss-term-cut", "", ["reg"])
    assert "inside its forward" not in problem.message and problem.source is None
    assert "outside every forward" in problem.message and "it starves reg" in problem.message


class _StackDepth(nn.Module):
    """A model call that notes how many modes are on torch's function stack as it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch._C._len_torch_function_stack())
        return x


@pytest.mark.parametrize("between", ["optimizer step", "past the window's cap"])
def test_the_loss_window_leaves_torchs_stack_before_a_later_model_call(
        tmp_path: Path, between: str) -> None:
    """A recorded step's model call that no ``backward()`` follows (an evaluation, a skipped
    batch) opened the loss window: it leaves torch's mode stack when the step ends (an optimizer
    step), or once it followed its cap of operations, not in a later model call."""
    model, probe = mlp(), _StackDepth()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 8)
    with hooktrace.trace(tmp_path / "log.jsonl"):
        for _ in range(2):
            out = model(x)
            if between == "optimizer step":
                optimizer.step()
            else:
                for _ in range(5000):  # more than the window follows
                    out = out + 0
            probe(x)
    assert probe.seen == [0, 0]
    assert torch._C._len_torch_function_stack() == 0

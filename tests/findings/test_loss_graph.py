"""The loss seen from the root of each backward pass (``hooktrace/observe/lossgraph.py``): the
walk of real autograd graphs, the signals a traced run writes, that tracing changes nothing in the
program, and ``check`` on the bugs and look-alikes of ``scripts/loss_graph.py``."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import Cases, Run, Shared, problems, read_log, run_cases, run_findings
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.log import schema
from hooktrace.observe import lossgraph

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "loss_graph.py"


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(6, 8), torch.randint(0, 4, (6,))


def signals(path: Path, kind: str) -> list[schema.Signal]:
    return [r for r in read_log(path) if isinstance(r, schema.Signal) and r.kind == kind]


# -- the walk, on graphs built here -----------------------------------------------------------

def test_scale_multiplications_are_counted_along_one_path() -> None:
    scaler = torch.amp.GradScaler("cpu")
    model, (x, y) = mlp(), batch()
    loss = F.cross_entropy(model(x), y)
    once = scaler.scale(loss)
    ptr = scaler._scale.data_ptr()  # type: ignore[union-attr]
    assert lossgraph.walk(once.grad_fn, set(), ptr).scales == 1
    assert lossgraph.walk(scaler.scale(once).grad_fn, set(), ptr).scales == 2
    assert lossgraph.walk((scaler.scale(once) / 4).grad_fn, set(), ptr).scales == 2
    # two losses scaled each, then added: once on each path
    assert lossgraph.walk((once + scaler.scale(loss * 2)).grad_fn, set(), ptr).scales == 1
    assert lossgraph.walk(loss.grad_fn, set(), ptr).scales == 0
    assert lossgraph.walk(once.grad_fn, set(), None).scales == -1  # no scaler known


def test_a_gradient_penalty_is_not_a_second_scale() -> None:
    # the double-backward graph of autograd.grad(scaler.scale(loss)) multiplies by the scale
    # too, below the norm the penalty takes
    scaler = torch.amp.GradScaler("cpu")
    model, (x, y) = mlp(), batch()
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(scaler.scale(loss), list(model.parameters()), create_graph=True)
    penalty = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    root = scaler.scale(loss + penalty)
    ptr = scaler._scale.data_ptr()  # type: ignore[union-attr]
    assert lossgraph.walk(root.grad_fn, set(), ptr).scales == 1


def test_no_saved_tensor_is_unpacked_through_a_hook() -> None:
    # a hooked saved tensor (activation checkpointing, offloading): its unpack hook would run
    # the checkpointed forward again; the walk reads around it
    unpacked = []
    scale = torch.tensor(65536.0)
    model, (x, y) = mlp(), batch()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(1) or t):
        root = F.cross_entropy(model(x), y) * scale
    assert not lossgraph.is_scale(root.grad_fn, scale.data_ptr())
    assert lossgraph.walk(root.grad_fn, set(), scale.data_ptr()).scales == 0
    assert unpacked == []


def test_op_names_and_losses() -> None:
    model, (x, y) = mlp(), batch()
    out = model(x)
    assert lossgraph.op_name(F.cross_entropy(out, y).grad_fn) == "NllLoss"
    assert lossgraph.op_name(out.grad_fn) == "Addmm"
    assert lossgraph.is_loss("BinaryCrossEntropyWithLogits")
    assert lossgraph.is_loss("MseLoss") and not lossgraph.is_loss("LogSoftmax")


# -- a traced run writes what the graph says ------------------------------------------------------

def traced_steps(path: Path, loss_fn: Any, steps: int = 2, scaler: Any = None) -> nn.Module:
    model, (x, y) = mlp(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hooktrace.trace(path):
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            (scaler.step(opt) if scaler is not None else opt.step())
            if scaler is not None:
                scaler.update()
    return model


def test_the_ops_from_a_functional_loss_back_to_the_model(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    traced_steps(path, lambda out, y: F.cross_entropy(F.softmax(out, dim=1), y))
    [found] = signals(path, "loss-ops")  # written once: it did not change at step 1
    assert (found.step, found.model, found.fqn) == (0, 0, "")
    assert found.detail == {"loss": "NllLoss", "ops": ["LogSoftmax", "Softmax"], "out": "Addmm",
                            "last": "2"}
    assert signals(path, "loss-scaled") == []  # no scaler in this run


def test_a_loss_module_is_walked_through(tmp_path: Path) -> None:
    # nn.CrossEntropyLoss is a module (a model of its own, without parameters): the walk goes
    # through its output to the model's
    path = tmp_path / "log.jsonl"
    criterion = nn.CrossEntropyLoss()
    traced_steps(path, lambda out, y: criterion(out, y), steps=1)
    [found] = signals(path, "loss-ops")
    assert found.detail["ops"] == ["LogSoftmax"] and found.detail["out"] == "Addmm"


def test_the_scale_in_the_loss_and_a_scaler_used_right(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    traced_steps(path, F.cross_entropy, scaler=torch.amp.GradScaler("cpu"))
    assert [s.detail for s in signals(path, "loss-scaled")] == [{"times": 1}]
    assert signals(path, "scaled-step") == signals(path, "scaled-clip") == []


def test_an_optimizer_stepping_scaled_gradients(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    model, (x, y) = mlp(), batch()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    with hooktrace.trace(path):
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            opt.step()
    [found] = signals(path, "scaled-step")  # once per optimizer
    assert (found.step, found.detail) == (0, {"optimizer": "SGD", "modules": ["0", "2"]})


def test_tracing_changes_nothing_and_puts_everything_back(tmp_path: Path) -> None:
    def run(trace: bool) -> list[torch.Tensor]:
        model, (x, y) = mlp(), batch()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        with hooktrace.trace(tmp_path / "log.jsonl") if trace else nullcontext():
            for _ in range(3):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = F.cross_entropy(F.softmax(model(x), dim=1), y)
                scaler.scale(loss).backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # before unscale_: said
                scaler.step(opt)
                scaler.update()
        return [p.detach().clone() for p in model.parameters()]

    backward, clip = torch.autograd.backward, nn.utils.clip_grad_norm_
    untraced, traced = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(untraced, traced, strict=True))
    assert torch.autograd.backward is backward and nn.utils.clip_grad_norm_ is clip
    assert [s.kind for s in signals(tmp_path / "log.jsonl", "scaled-clip")] == ["scaled-clip"]


def test_an_error_in_the_walk_never_reaches_the_program(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("a walk that fails")

    monkeypatch.setattr(lossgraph, "walk", broken)
    monkeypatch.setattr(lossgraph, "output_calls", broken)
    path = tmp_path / "log.jsonl"
    model = traced_steps(path, F.cross_entropy, steps=3, scaler=torch.amp.GradScaler("cpu"))
    assert all(p.grad is not None for p in model.parameters())
    assert signals(path, "loss-ops") == []
    end = read_log(path)[-1]
    assert isinstance(end, schema.End) and end.status == "ok" and end.tracer_error is None


def test_an_exception_of_backward_itself_is_the_programs(tmp_path: Path) -> None:
    model, (x, y) = mlp(), batch()
    with hooktrace.trace(tmp_path / "log.jsonl"):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    assert torch.autograd.backward.__module__ == "torch.autograd"


# -- check on the bugs and look-alikes ---------------------------------------------------------

# case -> its first problem (kind, severity, model, module, step); the others follow from it
BUGS: dict[str, tuple[Any, ...]] = {
    "module_ce_on_functional_softmax": ("loss-input", "warning", "m", "", 0),
    "nll_on_conv_scores": ("loss-input", "warning", "model", "classifier", 0),
    "bce_logits_on_functional_sigmoid": ("loss-input", "warning", "m", "", 0),
    "scaled_step_accumulated": ("scaled-step", "error", "model", "", 1),
}
HEALTHY = [
    "ok_ce_label_smoothing", "ok_log_softmax_nll", "ok_log_of_softmax_nll",
    "ok_model_ends_log_softmax", "ok_bce_on_sigmoid", "ok_bce_logits_on_logits", "ok_distill_kl",
    "ok_checkpointed_masked_loss", "ok_scaler_step", "ok_unscale_clip_step",
    "ok_unscale_then_optimizer_step", "ok_fused_adam_scaler", "ok_scaler_disabled",
    "ok_gan_amp_one_scaler", "ok_second_optimizer_unscaled_pass", "ok_gradient_penalty_amp",
]


@pytest.fixture(scope="module")
def runs(shared: Shared) -> Cases:
    return run_cases(shared, "lossgraph", [*BUGS, *HEALTHY],
                     lambda case: SCRIPT)


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_bug_is_named(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    named = problems(found)
    assert named[0] == BUGS[case]
    assert all(f["evidence"].get("follows") for f in found[1:] if f["severity"] != "note")
    assert status == 1


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_are_silent(runs: dict[str, Run], case: str) -> None:
    status, found = run_findings(runs[case])
    assert problems(found) == []
    assert status == 0


def test_backward_of_a_generator_gets_all_its_tensors(tmp_path: Path) -> None:
    model, (x, y) = mlp(), batch()
    with hooktrace.trace(tmp_path / "log.jsonl"):
        losses = [F.cross_entropy(model(x), y), model(x).pow(2).mean()]
        torch.autograd.backward(loss for loss in losses)
    assert all(p.grad is not None for p in model.parameters())


# -- check's reading of the signals, on records written here --------------------------------------

def loss_findings(*details: dict[str, Any]) -> list[tuple[str, str]]:
    from hooktrace.check.collected import Collected
    from hooktrace.check.losses import check_losses

    c = Collected(header=schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="test"))
    c.models[0] = "model"
    c.signals = [schema.Signal(0, 0, "", "loss-ops", d) for d in details]
    return [(f.cause, f.module) for f in check_losses(c)]


@pytest.mark.parametrize(("ops", "out", "named"), [
    (["LogSoftmax", "Softmax"], "Addmm", True),  # F.cross_entropy(F.softmax(model(x)))
    (["LogSoftmax", "View", "Softmax", "ToCopy"], "Addmm", True),  # views and casts between
    (["LogSoftmax"], "Softmax", True),  # the model ends with a softmax
    (["LogSoftmax"], "Addmm", False),  # F.cross_entropy(model(x))
    (["LogSoftmax", "Sigmoid"], "Addmm", False),  # another squashing, not a softmax twice
    (["Log", "Add", "Softmax"], "Addmm", False),  # torch.log of probabilities
    ([], "LogSoftmax", False),  # the model ends with log_softmax
])
def test_probabilities_into_cross_entropy(ops: list[str], out: str, named: bool) -> None:
    found = loss_findings({"loss": "NllLoss", "ops": ops, "out": out, "last": "2"})
    assert found == ([("loss-input", "2" if out == "Softmax" else "")] if named else [])


@pytest.mark.parametrize(("loss", "ops", "out", "named"), [
    ("NllLoss", [], "Addmm", True),
    ("NllLoss2D", ["View"], "Convolution", True),
    ("NllLoss", ["Sub"], "Addmm", False),  # scores minus their logsumexp: log-probabilities
    ("MseLoss", [], "Addmm", False),
    ("BinaryCrossEntropyWithLogits", ["Sigmoid"], "Addmm", True),
    ("BinaryCrossEntropyWithLogits", [], "Sigmoid", True),
    ("BinaryCrossEntropyWithLogits", [], "Addmm", False),
    ("BinaryCrossEntropy", ["Sigmoid"], "Addmm", False),
])
def test_scores_and_probabilities_into_other_losses(loss: str, ops: list[str], out: str,
                                                    named: bool) -> None:
    assert bool(loss_findings({"loss": loss, "ops": ops, "out": out})) == named


class Wrapping(torch.optim.Optimizer):
    """An optimizer that steps another (as ZeroRedundancyOptimizer steps its local one)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        super().__init__([p for g in inner.param_groups for p in g["params"]], {})
        self.inner = inner

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.inner.step()


def test_an_optimizer_stepped_inside_the_scalers_step(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    model, (x, y) = mlp(), batch()
    opt = Wrapping(torch.optim.SGD(model.parameters(), lr=1e-3))
    scaler = torch.amp.GradScaler("cpu")
    with hooktrace.trace(path):
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            scaler.step(opt)
            scaler.update()
    assert [s.detail for s in signals(path, "loss-scaled")] == [{"times": 1}]
    assert signals(path, "scaled-step") == []

"""Gradient statistics in the log equal what torch computes for the same step: per-call
gradient norms and absolute maxima, parameter-gradient norms, NaN/Inf counts.

Every test runs three ways: the CPU path (numbers read at once), and the accelerator path run
on CPU tensors (numbers left as tensors until the step ends, then one transfer), with the
tensors kept for a second look at NaN/Inf and without (past the byte budget)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from helpers import events, read_log
from torch import nn

import hooktrace
from hooktrace.log import schema
from hooktrace.observe.outputs import HeldOutputs
from hooktrace.observe.stats import DEFER_ENV, TensorStats

REL = 1e-3  # the log keeps 4 significant digits


@pytest.fixture(autouse=True, params=["host", "device", "device-unheld"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param != "host":
        monkeypatch.setenv(DEFER_ENV, "1")
    if request.param == "device-unheld":
        monkeypatch.setattr("hooktrace.observe.stats.HOLD_BYTES", 0)
    return str(request.param)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3, bias=False))


def _reference(model: nn.Sequential, x: torch.Tensor, weights: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
    """Gradients of every intermediate tensor by retain_grad (and of the parameters)."""
    h1 = model[0](x)
    h2 = model[1](h1)
    out = model[2](h2)
    for t in (h1, h2, out):
        t.retain_grad()
    (out * (torch.arange(3.0) if weights is None else weights)).sum().backward()
    assert h1.grad is not None and h2.grad is not None and out.grad is not None
    return {"0.out": h1.grad, "1.out": h2.grad, "2.out": out.grad}


def _close(logged: float, expected: float) -> bool:
    return math.isclose(logged, expected, rel_tol=REL, abs_tol=1e-12)


def test_gradient_statistics_match_torch(log_path: Path) -> None:
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(5, 4)
    reference = _reference(twin, x)
    with hooktrace.trace(log_path, model=model):
        (model(x) * torch.arange(3.0)).sum().backward()

    bwd = {e.fqn: e for e in events(log_path, "backward")}
    for name in ("0", "1", "2"):
        grad = reference[f"{name}.out"]
        stats = bwd[name].grad_output_stats
        assert stats is not None and stats[0] is not None
        norm, absmax = stats[0]
        assert _close(norm, grad.norm().item()), name
        assert _close(absmax, grad.abs().max().item()), name
    # a module's grad_input is its input tensor's gradient: the previous module's output
    for name, previous in (("1", "0"), ("2", "1")):
        stats = bwd[name].grad_input_stats
        assert stats is not None and stats[0] is not None
        assert _close(stats[0][0], reference[f"{previous}.out"].norm().item())
    assert bwd["0"].grad_input_stats == [None]  # x needs no gradient

    params = [r for r in read_log(log_path) if isinstance(r, schema.ParamGrads)]
    assert len(params) == 1
    norms = params[0].grad_norm
    assert set(norms) == {"0", "2"}  # Tanh has no parameters
    first = torch.cat([twin[0].weight.grad.flatten(), twin[0].bias.grad])  # type: ignore[union-attr]
    assert _close(norms["0"] or 0.0, first.norm().item())
    assert _close(norms["2"] or 0.0, twin[2].weight.grad.norm().item())  # type: ignore[union-attr]


def test_parameters_without_gradient_are_none(log_path: Path) -> None:
    """A module that ran with trainable parameters but whose parameters got no .grad."""
    model = _model()
    x = torch.randn(5, 4)
    with hooktrace.trace(log_path, model=model):
        out = model(x)
        model[2].weight.grad = None
        torch.autograd.grad(out.sum(), [model[0].weight])  # no .grad is set anywhere
    params = [r for r in read_log(log_path) if isinstance(r, schema.ParamGrads)]
    assert params and params[0].grad_norm == {"0": None, "2": None}


@pytest.mark.parametrize(("bad", "nan", "inf"), [(math.nan, 2, 0), (math.inf, 0, 2)])
def test_nonfinite_gradients_are_counted(log_path: Path, bad: float, nan: int, inf: int) -> None:
    model = _model()
    x = torch.randn(5, 4)
    weights = torch.ones(5, 3)
    weights[0, 0] = weights[1, 2] = bad
    with hooktrace.trace(log_path, model=model):
        (model(x) * weights).sum().backward()
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    stats = bwd["2"].grad_output_stats
    assert stats is not None and stats[0] is not None
    assert len(stats[0]) == 4 and not math.isfinite(stats[0][0])
    assert stats[0][2:] == [nan, inf]
    params = next(r for r in read_log(log_path) if isinstance(r, schema.ParamGrads))
    assert not math.isfinite(params.grad_norm["2"] or 0.0)


@pytest.mark.parametrize("scale", [1e-25, 1e25])
def test_tiny_and_huge_gradients_keep_their_norm(log_path: Path, scale: float, path: str
                                                  ) -> None:
    """Squares of such values under/overflow float32: the norm must still be the true one."""
    if path == "device-unheld" and scale > 1:
        pytest.skip("a tensor past the byte budget is not kept: a norm past 1.8e19 stays inf")
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(5, 4)
    weights = torch.full((5, 3), scale)
    out = twin(x)
    out.retain_grad()
    (out * weights).sum().backward()
    assert out.grad is not None
    with hooktrace.trace(log_path, model=model):
        (model(x) * weights).sum().backward()
    stats = next(e for e in events(log_path, "backward") if e.fqn == "2").grad_output_stats
    assert stats is not None and stats[0] is not None
    assert _close(stats[0][0], torch.linalg.vector_norm(out.grad.double()).item())
    assert _close(stats[0][1], scale)


def test_huge_parameter_gradients_keep_their_norm(log_path: Path) -> None:
    model = _model()
    x = torch.randn(5, 4)
    with hooktrace.trace(log_path, model=model):
        (model(x) * 1e25).sum().backward()
    params = next(r for r in read_log(log_path) if isinstance(r, schema.ParamGrads))
    expected = torch.linalg.vector_norm(model[2].weight.grad.double()).item()  # type: ignore[union-attr]
    assert math.isfinite(expected) and _close(params.grad_norm["2"] or 0.0, expected)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_outputs_are_counted(log_path: Path, bad: float) -> None:
    model = _model()
    x = torch.randn(5, 4)
    x[1, :3] = bad
    expected: dict[str, list[list[int]] | None] = {}
    h = x
    for name, layer in model.named_children():
        h = layer(h)
        nan, inf = int(torch.isnan(h).sum()), int(torch.isinf(h).sum())
        expected[name] = [[0, nan, inf]] if nan or inf else None
    assert expected["0"] and expected["2"]  # the bad row reaches the output
    with hooktrace.trace(log_path, model=model):
        model(x).sum().backward()
    forward = {e.fqn: e.output_nonfinite for e in events(log_path, "forward")
               if isinstance(e, schema.ForwardEvent)}
    assert {name: forward[name] for name in expected} == expected


def test_watched_steps_report_only_nonfinite_gradients(log_path: Path) -> None:
    """After the recorded steps a gradient is only checked for NaN/Inf (one sum): a NaN loss
    weight gives an anomaly at its step; huge finite gradients (their float32 sum overflows)
    give none, as the reference gradients say."""
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(5, 4)
    scales = [1.0, 1.0, 3e37, math.nan, 1.0]  # step 0 recorded, the rest watched
    reference = _reference(twin, x, torch.full((5, 3), 3e37))
    assert all(bool(torch.isfinite(g).all()) for g in reference.values())
    assert not math.isfinite(reference["2.out"].sum().item())  # the float32 sum overflows
    with hooktrace.trace(log_path, model=model, steps="0"):
        for scale in scales:
            model.zero_grad()
            (model(x) * torch.full((5, 3), scale)).sum().backward()
    anomalies = [r for r in read_log(log_path) if isinstance(r, schema.Anomaly)]
    assert {(a.step, a.kind) for a in anomalies} == {(3, "nonfinite-backward")}


def test_a_nan_that_stays_is_written_for_ten_steps_until_it_goes(log_path: Path) -> None:
    """Watched steps write a NaN/Inf for the first 10 steps of a spell, not in every step it
    stays (a run that goes NaN at step 10 of 100,000 writes 20 records, not 200,000); once a
    step is finite again, the next NaN/Inf is said again (a GradScaler's skipped step)."""
    model = _model()
    x = torch.randn(5, 4)
    bad = {*range(2, 16), 18}  # step 0 recorded, the rest watched
    with hooktrace.trace(log_path, model=model, steps="0"):
        for step in range(20):
            model.zero_grad()
            scale = math.nan if step in bad else 1.0
            (model(x * scale)).sum().backward()
    anomalies = [r for r in read_log(log_path) if isinstance(r, schema.Anomaly)]
    for kind in ("nonfinite-forward", "nonfinite-backward"):
        assert [a.step for a in anomalies if a.kind == kind] == [*range(2, 12), 18]


def test_watched_steps_name_the_first_nonfinite_output(log_path: Path) -> None:
    """A watched step checks the outputs once per model call, and one by one only when the
    model's are not finite: it names the first module whose output held NaN, also when an
    in-place activation then rewrites that output, also in the second model of a step, and
    past the bytes held (the unheld path checks every output at once)."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 8))
    head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    with hooktrace.trace(log_path, model=[encoder, head], steps="0"):
        for step in range(5):  # step 0 recorded, the rest watched
            with torch.no_grad():
                if step == 2:  # the head's first layer: NaN, kept by its in-place ReLU
                    head[0].bias[1] = math.nan
                if step == 3:  # and now the encoder's last layer, which runs before it
                    encoder[2].weight[0, 0] = math.inf
                if step == 4:
                    head[0].bias[1] = encoder[2].weight[0, 0] = 0.0
            head(encoder(x)).sum().backward()
    found = {(a.step, a.model, a.fqn, a.detail["outputs"][0]["index"])
             for a in read_log(log_path)
             if isinstance(a, schema.Anomaly) and a.kind == "nonfinite-forward"}
    assert found == {(2, 1, "0", 0), (3, 0, "2", 0)}


@pytest.mark.parametrize("hold_bytes", [0, 1 << 20])
def test_held_outputs_name_the_first_call_in_order(hold_bytes: int) -> None:
    """``HeldOutputs`` on its own: the calls whose outputs held NaN/Inf, in call order across
    model calls, with their counts; held outputs (1 MB) are looked at only because the model's
    output is not finite, outputs past the bytes held (0) are checked at once; an integer output
    and a parent returning its child's tensor are not checked again."""
    stats = TensorStats()
    held = HeldOutputs(stats, hold_bytes)
    fine, bad = torch.ones(4), torch.tensor([1.0, math.nan, math.inf, math.nan])
    held.add([fine, torch.arange(3)], "a", top=False)
    held.add([bad], "b", top=False)
    held.add([bad], "parent of b", top=False)
    held.add([fine, bad.clone()], "model 1", top=True)
    held.add([fine], "c", top=False)
    held.add([fine], "model 2", top=True)
    stats.resolve()
    found = held.take()
    in_order = [("b", [[0, 2, 1]]), ("model 1", [[1, 2, 1]])]
    if hold_bytes == 0:  # checked at once: the parent's copy of b's output too
        in_order.insert(1, ("parent of b", [[0, 2, 1]]))
    assert found == in_order
    assert held.take() == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(log_path: Path, dtype: torch.dtype) -> None:
    model = _model().to(dtype)
    twin = copy.deepcopy(model)
    x = torch.randn(5, 4, dtype=dtype)
    reference = _reference(twin, x, torch.arange(3.0, dtype=dtype))
    with hooktrace.trace(log_path, model=model):
        (model(x) * torch.arange(3.0, dtype=dtype)).sum().backward()
    bwd = {e.fqn: e for e in events(log_path, "backward") if isinstance(e, schema.BackwardEvent)}
    for name in ("0", "1", "2"):
        grad = reference[f"{name}.out"].double()
        stats = bwd[name].grad_output_stats
        assert stats is not None and stats[0] is not None
        assert _close(stats[0][0], grad.norm().item()), (name, stats)
        assert _close(stats[0][1], grad.abs().max().item()), (name, stats)


class _Fft(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x)


class _Magnitude(nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z.abs()


def test_complex_gradients(log_path: Path) -> None:
    """A module with a complex output (an FFT) gets a complex gradient: its norm and its
    largest magnitude."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), _Fft(), _Magnitude())
    x, weights = torch.randn(5, 4), torch.randn(5, 8)
    spectrum = model[1](model[0](x))
    spectrum.retain_grad()
    (model[2](spectrum) * weights).sum().backward()
    expected = spectrum.grad
    assert expected is not None and expected.is_complex()
    with hooktrace.trace(log_path, model=model):
        (model(x) * weights).sum().backward()
    bwd = {e.fqn: e for e in events(log_path, "backward") if isinstance(e, schema.BackwardEvent)}
    stats = bwd["1"].grad_output_stats
    assert stats is not None and stats[0] is not None
    assert _close(stats[0][0], expected.norm().item()), stats
    assert _close(stats[0][1], expected.abs().max().item()), stats

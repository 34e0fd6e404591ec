"""The bundled samples, run for real: plain python and `hooktrace run` give the same output,
and the traces show what the issue promises (exact orders, shapes, models)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SAMPLES, events, hooktrace_cmd, names, read_log
from torch import nn

import hooktrace
from hooktrace.log import schema


def _plain(sample: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SAMPLES / sample), *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def mnist_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("mnist") / "mnist.jsonl"
    traced = hooktrace_cmd("run", "-o", log, SAMPLES / "mnist_net.py")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == _plain("mnist_net.py").stdout  # same losses: tracing changes nothing
    return log


def test_mnist_exact_orders(mnist_log: Path) -> None:
    for step in range(3):
        assert names(mnist_log, "forward", step) == [
            "conv1", "conv2", "dropout1", "fc1", "dropout2", "fc2", ""]
        assert names(mnist_log, "backward", step) == [
            "", "fc2", "dropout2", "fc1", "dropout1", "conv2", "conv1"]


def test_mnist_shapes(mnist_log: Path) -> None:
    forward = {e.fqn: e for e in events(mnist_log, "forward", 0)}
    assert forward["conv1"].input_shapes == [[8, 1, 28, 28]]
    assert forward["conv1"].output_shapes == [[8, 32, 26, 26]]
    assert forward["fc1"].input_shapes == [[8, 9216]]
    assert forward[""].output_shapes == [[8, 10]]


@pytest.mark.slow
def test_resnet_features_shapes(tmp_path: Path) -> None:
    log = tmp_path / "resnet.jsonl"
    traced = hooktrace_cmd("run", "-o", log, SAMPLES / "resnet_features.py")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == _plain("resnet_features.py").stdout
    forward = {e.fqn: e for e in events(log, "forward")}
    assert forward["layer3"].output_shapes == [[1, 1024, 14, 14]]
    assert forward["layer4"].input_shapes == [[1, 1024, 14, 14]]
    assert forward["layer4"].output_shapes == [[1, 2048, 7, 7]]
    backward = {e.fqn: e for e in events(log, "backward")}
    assert backward["layer4"].grad_output_shapes == [[1, 2048, 7, 7]]
    assert backward["layer4"].grad_input_shapes == [[1, 1024, 14, 14]]
    assert backward["conv1"].grad_input_shapes == [None]  # the image needs no gradient


def test_gan_models_kept_apart(tmp_path: Path) -> None:
    log = tmp_path / "gan.jsonl"
    traced = hooktrace_cmd("run", "-o", log, SAMPLES / "gan.py")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == _plain("gan.py").stdout
    records = read_log(log)
    models = {r.model: r.name for r in records if isinstance(r, schema.Model)}
    assert models == {0: "generator", 1: "discriminator", 2: "criterion"}
    # step 0 is the discriminator's backward: the fake batch was detached, so the generator
    # gets no backward event; step 1 (the generator's loss) reaches all three models
    by_step = {(e.step, e.phase, e.model) for e in events(log)}
    assert (0, "backward", 0) not in by_step
    assert {(1, "backward", m) for m in (0, 1, 2)} <= by_step
    # the generator's backward at step 1 pairs with its forward call of step 0
    forward = {e.seq: e for e in events(log, "forward")}
    generator_backward = [e for e in events(log, "backward", 1) if e.model == 0]
    assert generator_backward and all(forward[e.fwd].step == 0 for e in generator_backward)


class _Unreadable(dict):  # type: ignore[type-arg]
    """A user's output type the tracer cannot walk: its values() raises."""

    def values(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("values are private")


class _OddOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> _Unreadable:
        return _Unreadable(out=x * 2)


def test_internal_error_is_reported_once_and_the_script_goes_on(
        log_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(2, 2), _OddOutput())
    with hooktrace.trace(log_path, model=model):
        for _ in range(3):
            out = model(torch.randn(1, 2))
            dict.__getitem__(out, "out").sum().backward()
    err = capsys.readouterr().err
    assert err.count("hooktrace: internal error, tracing stopped (your script goes on)") == 1
    assert "values are private" in err
    end = read_log(log_path)[-1]
    assert isinstance(end, schema.End)
    assert end.status == "ok" and end.tracer_error == "RuntimeError: values are private"

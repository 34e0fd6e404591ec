"""--capture saves tensors next to the log; --break-on nan stops at the first NaN/Inf module."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import SAMPLES, events, hooktrace_cmd, read_log
from torch import nn

import hooktrace
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError, NonFiniteError


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))


def test_capture_saves_forward_and_backward_tensors(log_path: Path) -> None:
    net = _net()
    x = torch.randn(3, 4)
    with hooktrace.trace(log_path, model=net, capture=["0", "2"]):
        net(x).sum().backward()
    folder = log_path.with_name("trace.capture")
    assert sorted(p.name for p in (folder / "step0").iterdir()) == [
        "net.0.call0.backward.pt", "net.0.call0.forward.pt", "net.2.call0.backward.pt",
        "net.2.call0.forward.pt"]
    forward = torch.load(folder / "step0" / "net.0.call0.forward.pt")
    assert (forward["model"], forward["module"], forward["step"], forward["call"]) == (
        "net", "0", 0, 0)
    assert torch.equal(forward["inputs"][0], x)
    # the output as the module returned it, before the in-place ReLU changed it
    assert torch.equal(forward["outputs"][0], net[0](x).detach())
    backward = torch.load(folder / "step0" / "net.2.call0.backward.pt")
    assert torch.equal(backward["grad_outputs"][0], torch.ones(3, 2))
    assert backward["grad_inputs"][0].shape == (3, 8)
    first = torch.load(folder / "step0" / "net.0.call0.backward.pt")
    assert first["grad_inputs"] == [None]  # x needs no gradient
    end = read_log(log_path)[-1]
    assert isinstance(end, schema.End) and end.captured == 4


@pytest.mark.parametrize("inplace", [True, False])
def test_capture_saves_the_input_an_in_place_module_overwrites(inplace: bool,
                                                               tmp_path: Path) -> None:
    """ReLU(inplace=True) writes its output over its input: the input saved is the one it was
    given, negatives and all (before, the output twice); a ReLU not in place is the
    look-alike."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=inplace))
    x = torch.randn(3, 4)
    log = tmp_path / "relu.jsonl"
    with hooktrace.trace(log, model=net, capture=["1"]):
        net(x).sum().backward()
    saved = torch.load(tmp_path / "relu.capture" / "step0" / "net.1.call0.forward.pt")
    given = net[0](x).detach()
    assert (given < 0).any()
    assert torch.equal(saved["inputs"][0], given)
    assert torch.equal(saved["outputs"][0], given.clamp(min=0))


def test_capture_is_mentioned_by_run_and_check(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = hooktrace_cmd("run", "-o", log, "--capture", "fc*", SAMPLES / "mnist_net.py",
                           "--steps", "2")
    assert result.returncode == 0, result.stderr
    # fc1 and fc2, forward and backward, two steps
    assert f"8 tensor files in {tmp_path / 'log.capture'}" in result.stderr.splitlines()[-2]
    checked = hooktrace_cmd("check", log)
    assert f"captured tensors (torch.load): {tmp_path / 'log.capture'} (8 files)" in checked.stdout
    rendered = hooktrace_cmd("render", log, "--format", "dot")
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stderr.rstrip().endswith(
        f"; captured tensors: {tmp_path / 'log.capture'} (8 files)")


def test_include_and_capture_by_class(tmp_path: Path) -> None:
    """``Conv2d`` names every Conv2d (mnist's conv1 and conv2), ``Dropout`` every dropout;
    ``conv*`` names fqns, and ``linear`` no class (case counts: a class is CamelCase)."""
    log = tmp_path / "log.jsonl"
    result = hooktrace_cmd("run", "-o", log, "--include", "Conv2d", "--include", "fc1",
                           "--exclude", "Dropout", "--capture", "Conv2d",
                           SAMPLES / "mnist_net.py", "--steps", "1")
    assert result.returncode == 0, result.stderr
    assert [e.fqn for e in events(log, "forward")] == ["conv1", "conv2", "fc1"]
    assert sorted(p.name for p in (tmp_path / "log.capture" / "step0").iterdir()) == [
        f"model.conv{i}.call0.{phase}.pt" for i in (1, 2) for phase in ("backward", "forward")]
    by_fqn = tmp_path / "fqn.jsonl"
    result = hooktrace_cmd("run", "-o", by_fqn, "--include", "conv*", "--include", "linear",
                           SAMPLES / "mnist_net.py", "--steps", "1")
    assert result.returncode == 0, result.stderr
    assert [e.fqn for e in events(by_fqn, "forward")] == ["conv1", "conv2"]


_GAN = """
import torch
from torch import nn

netG = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
netD = nn.Sequential(nn.Linear(8, 1))
for _ in range(2):
    netD(netG(torch.randn(3, 4))).sum().backward()
"""


def test_capture_keeps_models_apart_and_counts_what_it_wrote(tmp_path: Path) -> None:
    """A GAN's generator and discriminator both have a module "0": each call is its own file,
    named with its model, and the count said is the files there are."""
    script = tmp_path / "gan.py"
    script.write_text(_GAN)
    log = tmp_path / "gan.jsonl"
    result = hooktrace_cmd("run", "-o", log, "--capture", "0", script)
    assert result.returncode == 0, result.stderr
    files = sorted(str(p.relative_to(tmp_path / "gan.capture"))
                   for p in (tmp_path / "gan.capture").rglob("*.pt"))
    assert files == [f"step{s}/{model}.0.call0.{phase}.pt" for s in (0, 1)
                     for model in ("netD", "netG") for phase in ("backward", "forward")]
    assert f"8 tensor files in {tmp_path / 'gan.capture'}" in result.stderr
    generator = torch.load(tmp_path / "gan.capture" / "step1" / "netG.0.call0.forward.pt")
    assert (generator["model"], generator["module"], generator["step"]) == ("netG", "0", 1)
    assert generator["outputs"][0].shape == (3, 8)


def test_capture_stops_at_its_size_cap(log_path: Path) -> None:
    net = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))  # 256 KiB per 256x256 tensor
    with hooktrace.trace(log_path, model=net, capture=["*"], capture_max_mb=1):
        for _ in range(3):
            net(torch.randn(256, 256)).sum().backward()
    files = list(log_path.with_name("trace.capture").rglob("*.pt"))
    sizes = sum(f.stat().st_size for f in files)
    end = read_log(log_path)[-1]
    assert isinstance(end, schema.End) and end.captured == len(files)
    assert 0 < len(files) < 18 and sizes < 1.1 * 2**20


def test_capture_never_writes_into_a_folder_it_did_not_make(log_path: Path) -> None:
    folder = log_path.with_name("trace.capture")
    folder.mkdir()
    (folder / "mine.txt").write_text("precious")
    with pytest.raises(HooktraceError, match="not made by hooktrace"):
        hooktrace.trace(log_path, model=_net(), capture=["*"]).start()
    assert (folder / "mine.txt").read_text() == "precious"


class _Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x - 10)  # NaN for the inputs below


def test_break_on_nan_raises_without_a_terminal(log_path: Path) -> None:
    net = nn.Sequential(nn.Linear(4, 4), _Sqrt(), nn.Linear(4, 1))
    with pytest.raises(NonFiniteError, match=r"1 \(_Sqrt\) produced NaN/Inf at step 0"), \
            hooktrace.trace(log_path, model=net, break_on="nan"):
        net(torch.randn(2, 4))
    end = read_log(log_path)[-1]
    assert isinstance(end, schema.End)
    assert (end.status, end.error and end.error["type"]) == ("error", "NonFiniteError")


def test_break_on_nan_in_backward(log_path: Path) -> None:
    class GradBomb(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
            return grad * float("nan")

    class Bomb(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return GradBomb.apply(x)  # type: ignore[no-any-return]

    net = nn.Sequential(nn.Linear(4, 4), Bomb(), nn.Linear(4, 1))
    with hooktrace.trace(log_path, model=net, break_on="nan"):
        out = net(torch.randn(2, 4)).sum()
        with pytest.raises(NonFiniteError, match=r"backward of 1 \(Bomb\) produced a NaN/Inf"):
            out.backward()


def test_break_on_nan_opens_pdb_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (a real pty here) pdb opens at the module, with its tensors in reach."""
    script = tmp_path / "nan_script.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "class Sqrt(nn.Module):\n"
        "    def forward(self, x):\n        return torch.sqrt(x - 10)\n"
        "net = nn.Sequential(nn.Linear(4, 4), Sqrt())\n"
        "net(torch.randn(2, 4)).sum().backward()\nprint('script finished')\n")
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "run", "--break-on", "nan", "-o",
         str(tmp_path / "log.jsonl"), str(script)],
        stdin=secondary, stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    output = b""

    def read_until(marker: bytes, timeout: float = 120) -> None:
        nonlocal output
        deadline = time.monotonic() + timeout
        while marker not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if ready:
                try:
                    output += os.read(primary, 4096)
                except OSError:
                    break

    try:
        read_until(b"(Pdb) ")
        os.write(primary, b"p type(module).__name__, tuple(output.shape)\n")
        read_until(b"(2, 4))")
        os.write(primary, b"c\n")
        read_until(b"script finished")
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(primary)
    text = output.decode(errors="replace")
    assert "hooktrace --break-on nan: 1 (Sqrt) produced NaN/Inf at step 0" in text
    assert "('Sqrt', (2, 4))" in text
    assert "script finished" in text

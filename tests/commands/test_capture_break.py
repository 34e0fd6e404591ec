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


_NAN_SCRIPT = """\
import torch
from torch import nn


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x - 10)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.sqrt = Sqrt()

    def forward(self, x):
        h = self.fc(x)
        y = self.sqrt(h)
        return y.sum()


Net()(torch.randn(2, 4)).backward()
print("script finished")
"""


def _on_a_terminal(tmp_path: Path, dialogue: list[tuple[bytes, bytes]]) -> tuple[int, str]:
    """``hooktrace run --break-on nan`` of _NAN_SCRIPT on a real pty: each (marker, line) waits
    for ``marker`` in the output, then types ``line``; the exit status and all it printed."""
    script = tmp_path / "nan_script.py"
    script.write_text(_NAN_SCRIPT)
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "run", "--break-on", "nan", "-o",
         str(tmp_path / "log.jsonl"), str(script)], cwd=tmp_path,
        stdin=secondary, stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    output = b""

    def read_until(marker: bytes | None, timeout: float = 120) -> None:
        nonlocal output
        deadline = time.monotonic() + timeout
        while (marker is None or marker not in output) and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if ready:
                try:
                    output += os.read(primary, 4096)
                except OSError:
                    break  # the process ended
            elif marker is None and process.poll() is not None:
                break

    try:
        for marker, line in dialogue:
            read_until(marker)
            os.write(primary, line)
        read_until(None)
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(primary)
    return status, output.decode(errors="replace").replace("\r\n", "\n")


def test_break_on_nan_opens_pdb_at_the_users_line(tmp_path: Path) -> None:
    """On a terminal (a real pty) pdb opens in the user's forward, at the line that called the
    module, not in hooktrace: its input in reach, 'n' runs the line, 'c' goes on."""
    status, text = _on_a_terminal(tmp_path, [
        (b"(Pdb) ", b"p tuple(h.shape)\n"), (b"(2, 4)", b"n\n"),
        (b"(Pdb) ", b"p bool(y.isnan().any())\n"), (b"True", b"c\n")])
    assert status == 0, text
    assert ("hooktrace --break-on nan: sqrt (Sqrt) produced NaN/Inf at step 0 (output 0: 8 NaN, "
            "0 Inf) called at nan_script.py:18\n") in text
    assert "nan_script.py(18)forward()\n-> y = self.sqrt(h)" in text
    assert "nan_script.py(19)forward()\n-> return y.sum()" in text
    assert "hooktrace/" not in text.split("(Pdb)")[0].split("called at")[1]  # no frame of ours
    assert "script finished" in text and "internal error" not in text


def test_break_on_nan_q_quits_as_pdb_does(tmp_path: Path) -> None:
    """'q' ends the program with BdbQuit, as pdb's q does in plain python (before: an internal
    error of hooktrace, and the script ran on)."""
    status, text = _on_a_terminal(tmp_path, [(b"(Pdb) ", b"q\n")])
    assert status == 1, text
    assert text.rstrip().splitlines()[-3] == "bdb.BdbQuit"
    assert "script finished" not in text and "internal error" not in text


def test_break_on_nan_without_a_terminal_is_one_line(tmp_path: Path) -> None:
    """No terminal for pdb (stdin not a tty): the program stops at the NaN, with one line
    (before: a 30-line traceback through torch's and hooktrace's frames)."""
    (tmp_path / "nan_script.py").write_text(_NAN_SCRIPT)
    result = hooktrace_cmd("run", "--break-on", "nan", "-o", "log.jsonl", "nan_script.py",
                           cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        "hooktrace --break-on nan: sqrt (Sqrt) produced NaN/Inf at step 0 (output 0: 8 NaN, 0 "
        "Inf) called at nan_script.py:18; no terminal for pdb: the program stops")
    assert "Traceback" not in result.stderr and "script finished" not in result.stdout
    end = read_log(tmp_path / "log.jsonl")[-1]
    assert isinstance(end, schema.End) and (end.status, end.exit_code) == ("error", 1)

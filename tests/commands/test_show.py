"""``hooktrace show``: a step's events as an indented table.

The MNIST golden lives in tests/golden/; regenerate it with ``HOOKTRACE_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import SAMPLES, assert_golden
from torch import nn

import hooktrace
from hooktrace.cli import cli


@pytest.fixture(scope="module")
def mnist_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("mnist") / "mnist.jsonl"
    argv = sys.argv
    sys.argv = ["mnist_net.py", "--steps", "2"]
    try:
        with hooktrace.trace(log):
            runpy.run_path(str(SAMPLES / "mnist_net.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return log


def show(*args: str | Path) -> tuple[str, str]:
    result = CliRunner().invoke(cli, ["show", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def rows(text: str) -> list[list[str]]:
    """The table's rows, split into cells (fqn cells keep no indentation)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("seq"))
    out = []
    for line in lines[start + 1:]:
        if not line or not line.lstrip()[0].isdigit():
            break
        out.append(line.split())
    return out


def test_mnist_golden(mnist_log: Path) -> None:
    text, err = show(mnist_log)
    assert err == ""
    assert_golden("mnist_show.txt", text)


def test_mnist_order_indent_and_columns(mnist_log: Path) -> None:
    text, _ = show(mnist_log)
    table = rows(text)
    assert [(r[0], r[1], r[3]) for r in table] == [
        ("1", "forward", "conv1"), ("2", "forward", "conv2"), ("3", "forward", "dropout1"),
        ("4", "forward", "fc1"), ("5", "forward", "dropout2"), ("6", "forward", "fc2"),
        ("7", "forward", "(root)"),
        ("8", "backward", "(root)"), ("9", "backward", "fc2"), ("10", "backward", "dropout2"),
        ("11", "backward", "fc1"), ("12", "backward", "dropout1"), ("13", "backward", "conv2"),
        ("14", "backward", "conv1")]
    lines = text.splitlines()
    conv1 = next(line for line in lines if " conv1 " in line)
    root = next(line for line in lines if "(root)" in line)
    assert conv1.index("conv1") == root.index("(root)") + 2  # children indented under the root
    assert "8x1x28x28 -> 8x32x26x26" in conv1
    assert table[-1][-4:] == ["1/1", "8x32x26x26", "->", "-"]  # no gradient for the image


def test_phase_and_step(mnist_log: Path) -> None:
    text, _ = show(mnist_log, "--phase", "backward", "--step", "1")
    assert text.startswith(
        "step 1 (steps in the log: 0-1): model (Net): 7 forward events, 7 backward events")
    assert [r[1] for r in rows(text)] == ["backward"] * 7
    assert [r[0] for r in rows(text)] == [str(n) for n in range(22, 29)]


def test_long_steps_are_cut_with_a_hint(mnist_log: Path) -> None:
    text, _ = show(mnist_log, "--limit", "5")
    assert len(rows(text)) == 5
    assert ("... 9 more events: --limit 0 shows all; --phase, --model and --step narrow the "
            "view") in text
    everything, _ = show(mnist_log, "--limit", "0")
    assert len(rows(everything)) == 14 and "more events" not in everything


def test_several_models_get_a_model_column(tmp_path: Path) -> None:
    log = tmp_path / "two.jsonl"
    gen = nn.Sequential(nn.Linear(4, 4))
    disc = nn.Linear(4, 1)
    with hooktrace.trace(log, model=[gen, disc]):
        disc(gen(torch.randn(2, 4))).sum().backward()
    text, _ = show(log)
    assert [(r[2], r[4]) for r in rows(text)] == [
        ("gen", "0"), ("gen", "(root)"), ("disc", "(root)"),
        ("disc", "(root)"), ("gen", "(root)"), ("gen", "0")]
    only, _ = show(log, "--model", "disc")
    assert [r[3] for r in rows(only)] == ["(root)", "(root)"]


def test_odd_names_stay_on_one_line(tmp_path: Path) -> None:
    log = tmp_path / "odd.jsonl"
    model = nn.Sequential()
    model.add_module("new\nline", nn.Linear(2, 2))
    with hooktrace.trace(log, model=model):
        model(torch.randn(1, 2)).sum().backward()
    text, _ = show(log)
    assert [r[3] for r in rows(text)] == ["new\\nline", "(root)", "(root)", "new\\nline"]

"""A zoomed call's operations in ``show`` (rows under the table), ``view`` (a node's hover)
and ``render --ops`` (inside the module's box), from a real ``hooktrace run --ops``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import hooktrace_cmd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "op_bugs.py"
LINE = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1)
            if text.endswith("# numpy_clip numpy_out"))


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ops_show") / "log.jsonl"
    run = hooktrace_cmd("run", "-o", path, "--ops", "mid", SCRIPT, "numpy_clip", "2")
    assert run.returncode == 0, run.stderr
    return path


def test_show_prints_the_operations_under_the_table(log: Path) -> None:
    shown = hooktrace_cmd("show", log)
    assert shown.returncode == 0, shown.stderr
    block = shown.stdout.split("operations inside the zoomed calls (--ops):\n", 1)[1]
    lines = block.splitlines()
    assert lines[0] == "  mid (PercentileClip) call 0 (forward seq 2): 5 operations"
    assert [line.split()[:2] for line in lines[1:]] == [
        ["0", ".detach()"], ["1", ".cpu()"], ["2", ".numpy()"], ["3", ".to()"], ["4", ".mul()"]]
    assert f"op_bugs.py:{LINE}  16x8 -> 16x8" in lines[1]
    assert lines[1].endswith("no gradient out") and lines[3].endswith("leaves torch")
    assert "backward" in lines[5]  # the .mul() by the gain got its gradient
    backward = hooktrace_cmd("show", log, "--phase", "backward")
    assert "operations inside" not in backward.stdout


def test_render_ops_draws_them_inside_the_box(log: Path, tmp_path: Path) -> None:
    plain = hooktrace_cmd("render", log, "-o", tmp_path / "plain.dot")
    zoomed = hooktrace_cmd("render", log, "--ops", "-o", tmp_path / "ops.dot")
    assert plain.returncode == 0 and zoomed.returncode == 0, zoomed.stderr
    drawn = (tmp_path / "ops.dot").read_text()
    assert f".detach():{LINE} · no gradient out" in drawn
    assert ".detach()" not in (tmp_path / "plain.dot").read_text()
    svg = hooktrace_cmd("render", log, "--ops", "-o", tmp_path / "ops.svg")  # real dot
    assert svg.returncode == 0, svg.stderr
    assert f".detach():{LINE}" in (tmp_path / "ops.svg").read_text()


def test_view_hover_lists_them(log: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    made = hooktrace_cmd("view", log, "-o", page)
    assert made.returncode == 0, made.stderr
    assert re.search(r'"operations":\["\.detach\(\) \([^"]*op_bugs\.py:' + str(LINE)
                     + r'\) 16x8 no gradient out"', page.read_text())

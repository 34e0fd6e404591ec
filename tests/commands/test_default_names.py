"""Default output names with the real ``dot``: ``render`` and ``view`` write pictures of their
own names (the heatmap is not render's picture), marked, and write over them again; an output
that cannot be written is one line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import hooktrace_cmd

LOG = Path(__file__).resolve().parents[1] / "unit" / "logs" / "mnist.jsonl"


def test_render_and_the_heatmap_keep_apart_and_write_over_their_own(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    shutil.copyfile(LOG, log)
    for _ in range(2):
        for command in (["render", log, "--format", "png"], ["view", log, "--format", "png"],
                        ["render", log], ["view", log, "--format", "svg"], ["view", log]):
            result = hooktrace_cmd(*command, cwd=tmp_path)
            assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.heatmap.png", "a.heatmap.svg", "a.html", "a.jsonl", "a.png", "a.svg"]
    picture, heatmap = (tmp_path / "a.png").read_bytes(), (tmp_path / "a.heatmap.png").read_bytes()
    assert picture != heatmap
    assert b"tEXtSoftware\x00written by hooktrace" in picture[:100]
    assert (tmp_path / "a.svg").read_text().count("<!-- written by hooktrace -->") == 1


def unwritable(tmp_path: Path, how: str) -> Path:
    """A folder that takes no file: a file in its place (root too cannot write there), or a
    folder without write permission (which root ignores)."""
    folder = tmp_path / "out"
    if how == "a file":
        folder.write_text("not a folder")
    else:
        folder.mkdir(mode=0o555)
    return folder


@pytest.mark.parametrize("how", ["a file", pytest.param("read-only", marks=pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into any folder"))])
@pytest.mark.parametrize(("command", "name"), [("render", "a.svg"), ("view", "a.html"),
                                               ("export", "a.csv")])
def test_an_output_that_cannot_be_written_is_one_line(command: str, name: str, how: str,
                                                      tmp_path: Path) -> None:
    """The temporary file was never made: removing it must not hide why (two chained
    tracebacks, exit 1, before); a folder still to make is made (render, view)."""
    out = unwritable(tmp_path, how) / name
    result = hooktrace_cmd(command, LOG, "-o", out, cwd=tmp_path)
    why = "Not a directory" if how == "a file" else "Permission denied"
    assert (result.returncode, result.stderr) == (
        2, f"hooktrace: error: cannot write {out}: {why}\n")
    if command != "export":
        new = tmp_path / "new" / "folder" / name
        assert hooktrace_cmd(command, LOG, "-o", new, cwd=tmp_path).returncode == 0
        assert new.is_file()

"""Default output names with the real ``dot``: ``render`` and ``view`` write pictures of their
own names (the heatmap is not render's picture), marked, and write over them again."""

from __future__ import annotations

import shutil
from pathlib import Path

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

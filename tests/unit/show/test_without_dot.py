"""Without the Graphviz program ``dot``: ``view`` still writes its page (the heatmap and the
findings; no call graph, and one warning says why and how to install it), and what does need
``dot`` (``view --format svg|png``, ``render``) names the format and the package for apt, dnf,
brew and conda. ``dot`` is really absent: PATH names an empty folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hooktrace.cli import cli
from unit.logs import LOGS

INSTALL = ("apt install graphviz, dnf install graphviz, brew install graphviz or conda install "
           "-c conda-forge graphviz")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert shutil.which("dot") is None
    path = tmp_path / "nan.jsonl"
    shutil.copyfile(LOGS / "nan_layer.jsonl", path)
    return path


def hooktrace(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, list(map(str, args)))


def test_view_writes_the_page_without_call_graphs(log: Path) -> None:
    result = hooktrace("view", log)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        f"hooktrace: warning: the page has no call graphs: the Graphviz program dot is not "
        f"installed: {INSTALL}")
    assert result.stderr.splitlines()[1].startswith(f"hooktrace: wrote {log.with_suffix('.html')}")
    page = log.with_suffix(".html").read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert blob is not None
    data = json.loads(blob.group(1).replace("<\\/", "</"))
    graphs = data["ranks"][0]["graphs"]
    assert graphs and all(g["svg"] == "" and "unfold" not in g for g in graphs.values())
    assert data["nodot"].endswith(INSTALL)
    assert "<table class=" in data["ranks"][0]["heat"]["grad_output"]  # the heatmap is there
    assert any(f["cause"] == "nonfinite-forward" for f in data["findings"])


@pytest.mark.parametrize(("args", "fmt"), [
    (["view", "--format", "svg"], "svg"),
    (["view", "--format", "png"], "png"),
    (["render", "--format", "pdf"], "pdf"),
])
def test_pictures_need_dot_and_say_how_to_install_it(log: Path, args: list[str],
                                                     fmt: str) -> None:
    result = hooktrace(*args, log)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert f"the Graphviz program dot, needed for {fmt}, is not installed: {INSTALL}\n" in \
        result.stderr

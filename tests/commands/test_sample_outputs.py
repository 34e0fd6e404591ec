"""Every bundled sample, traced once, then read by ``view`` (the page), ``export`` (CSV) and
``render`` (SVG) for real: each writes its output and names the log's modules."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import SAMPLES, Traced, events, hooktrace_cmd, read_log

from hooktrace.log import schema

SLOW = {"resnet_features.py"}  # a real torchvision model


@pytest.fixture(params=[pytest.param(path, id=path.stem,
                                     marks=[pytest.mark.slow] if path.name in SLOW else [])
                        for path in sorted(SAMPLES.glob("*.py"))])
def sample_log(request: pytest.FixtureRequest, traced: Traced) -> Path:
    sample: Path = request.param
    return traced(sample)


def test_view_export_and_render_read_every_sample(sample_log: Path, tmp_path: Path) -> None:
    logged = events(sample_log)
    fqns = {e.fqn for e in logged if e.fqn}
    out = {fmt: tmp_path / f"{sample_log.stem}.{fmt}" for fmt in ("html", "csv", "svg")}
    for command, fmt in (("view", "html"), ("export", "csv"), ("render", "svg")):
        result = hooktrace_cmd(command, sample_log, "-o", out[fmt])
        assert result.returncode == 0, (command, result.stderr)
        assert "Traceback" not in result.stderr and out[fmt].stat().st_size > 0
    page = out["html"].read_text()
    assert '<script type="application/json" id="data">' in page
    assert any(f'"fqn":"{fqn}"' in page for fqn in fqns)
    with out["csv"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    # the root is written as show prints it: (root)
    assert len(rows) == len(logged) and {r["fqn"] for r in rows} == {
        e.fqn or "(root)" for e in logged}
    classes = {r["class"] for r in rows}
    sources = {f"{s.file}:{s.line}" for s in read_log(sample_log)
               if isinstance(s, schema.Source) and s.cls in classes}
    assert {r["source"] for r in rows} - {""} == sources  # the sample's own classes
    svg = out["svg"].read_text()
    assert "<svg" in svg and "</svg>" in svg

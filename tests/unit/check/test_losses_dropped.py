"""Losses computed to train and let go (``reached.losses_dropped``), judged on set 6's fixed log
of a gradient-accumulation loop whose one backward follows it: the model and its loss module
run four times a step and the backward reaches the last call only. Its look-alike, the same
run with the first three losses computed under no_grad (kept for a log), is silent."""

from __future__ import annotations

import json
import lzma
import tarfile
from pathlib import Path

from hooktrace.check.checklog import run_checks

ARCHIVE = Path(__file__).resolve().parents[1] / "logs" / "bugsets" / "set6.tar.xz"
CASE = "b26_accumulation_backward_last_only.jsonl"


def unpacked(tmp_path: Path, logged: bool = False) -> Path:
    """The fixed log; ``logged``: its loss module's calls that no backward reached rewritten as
    run under no_grad."""
    with tarfile.open(fileobj=lzma.open(ARCHIVE)) as tar:
        lines = tar.extractfile(CASE).read().decode().splitlines()  # type: ignore[union-attr]
    records = [json.loads(line) for line in lines]
    loss = {r["id"] for r in records if r.get("type") == "module" and r["class"] == "MSELoss"}
    backed = {(r["step"], r["module"], r["call"]) for r in records if r["type"] == "backward"}
    for r in records:
        if (logged and r["type"] == "forward" and r["module"] in loss
                and (r["step"], r["module"], r["call"]) not in backed):
            r["no_grad"] = True
    path = tmp_path / CASE
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_losses_let_go_in_every_step_are_said_at_the_model(tmp_path: Path) -> None:
    found = [f for f in run_checks(unpacked(tmp_path)).findings if f.cause == "loss-dropped"]
    [f] = found
    assert (f.kind, f.severity, f.model, f.module, f.step) == ("loss", "warning", "model", "", 0)
    assert (f.evidence["calls"], f.evidence["dropped"], f.evidence["losses"]) == (
        4, 3, ["criterion"])


def test_losses_computed_under_no_grad_are_not_let_go(tmp_path: Path) -> None:
    report = run_checks(unpacked(tmp_path, logged=True))
    assert [f for f in report.findings if f.cause == "loss-dropped"] == []

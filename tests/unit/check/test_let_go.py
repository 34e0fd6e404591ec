"""A module's output returned out of its model's forward and let go by the caller
(``flow``'s ``let_go`` boundary), judged on the fixed logs of bug sets 2 and 3: an auxiliary
head whose loss term became a number (``aux_loss.item()``) is said at that head, not at the
model whose forward returned it; DANN's label logits of the unlabelled target batch, let go
while the same head trains from its other call, are not said."""

from __future__ import annotations

import lzma
import tarfile
from pathlib import Path

from hooktrace.check.checklog import run_checks

ARCHIVES = Path(__file__).resolve().parents[1] / "logs" / "bugsets"


def unpacked(tmp_path: Path, name: str, case: str) -> Path:
    with tarfile.open(fileobj=lzma.open(ARCHIVES / f"{name}.tar.xz")) as tar:
        raw = tar.extractfile(f"{case}.jsonl").read()  # type: ignore[union-attr]
    path = tmp_path / f"{case}.jsonl"
    path.write_bytes(raw)
    return path


def test_a_returned_output_let_go_by_the_caller_is_said_at_its_module(tmp_path: Path) -> None:
    report = run_checks(unpacked(tmp_path, "set2", "b22_aux_loss_item"))
    [f] = report.problems
    assert (f.kind, f.cause, f.model, f.module, f.step) == (
        "gradient-flow", "no-grad", "model", "aux_head", 0)
    assert f.evidence["starved"] == ["aux_head.0", "aux_head.2"]


def test_a_returned_output_let_go_where_the_module_trains_elsewhere_is_silent(
        tmp_path: Path) -> None:
    report = run_checks(unpacked(tmp_path, "set3", "h08_dann_gradient_reversal"))
    assert report.problems == []

"""The ``signal`` record (``hooktrace.log.signals``): every kind documented where it is defined
and in docs/schema.md, read back from its line, an unknown kind skipped; and what the checked-in
logs' signals and anomalies name exists in their log."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.log.signals import VIEW_OPS, Signal
from hooktrace.log.writer import LogWriter
from unit.logs import LOGS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "schema.md"


def records(name: str) -> list[Any]:
    return list(LogReader(LOGS / f"{name}.jsonl"))


def signals(name: str, kind: str) -> list[Signal]:
    return [r for r in records(name) if isinstance(r, Signal) and r.kind == kind]


def test_kinds_are_unique() -> None:
    assert len(Signal.KINDS) == len(set(Signal.KINDS))
    assert len(schema.Anomaly.KINDS) == len(set(schema.Anomaly.KINDS))


def test_every_kind_is_a_row_of_the_docs_table() -> None:
    text = DOCS.read_text(encoding="utf-8").split("## Signals", 1)[1]
    rows = re.findall(r"^\| `([a-z-]+)` \|", text, re.MULTILINE)
    assert sorted(rows) == sorted(Signal.KINDS)


@pytest.mark.parametrize("kind", Signal.KINDS)
def test_each_kind_reads_back_from_its_line(kind: str) -> None:
    signal = Signal(step=2, model=1, fqn="fc", kind=kind, detail={"modules": ["fc"], "x": 1.5})
    line = orjson.loads(orjson.dumps(signal.to_dict()))
    assert line["type"] == "signal"
    assert schema.from_dict(line) == signal


def test_an_unknown_kind_is_skipped_in_a_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0"))
    writer.write(Signal(step=0, model=0, fqn="", kind="from-the-future"))
    writer.write(Signal(step=0, model=0, fqn="", kind="eval-backward"))
    writer.write(schema.End(status="ok"))
    writer.close()
    reader = LogReader(path)
    assert list(reader) == [Signal(step=0, model=0, fqn="", kind="eval-backward"),
                            schema.End(status="ok")]
    assert reader.warnings == []


def test_view_ops_are_node_names_without_backward() -> None:
    assert VIEW_OPS and all(re.fullmatch(r"[A-Z][A-Za-z]*", op) for op in VIEW_OPS)
    assert not any(op.endswith("Backward") for op in VIEW_OPS)
    assert {"View", "Reshape", "Transpose", "ToCopy"} <= VIEW_OPS
    assert not {"Addmm", "Relu", "LogSoftmax"} & VIEW_OPS  # ops that compute


# -- the checked-in logs' signals -----------------------------------------------------------------

NAMES = sorted(p.stem for p in LOGS.glob("*.jsonl"))


@pytest.mark.parametrize("name", NAMES)
def test_signals_name_modules_of_their_model(name: str) -> None:
    found = records(name)
    modules = {(m.model, m.fqn) for m in found if isinstance(m, schema.Module)}
    for r in found:
        if isinstance(r, (Signal, schema.Anomaly)):
            assert (r.model, r.fqn) in modules, r
            for key in ("held", "not_held", "modules"):
                for fqn in r.detail.get(key, []):
                    assert (r.model, fqn) in modules, (r, fqn)


def test_optimizers_hold_the_trainable_modules() -> None:
    found = records("mnist")
    trainable = {m.fqn for m in found if isinstance(m, schema.Module) and m.trainable}
    [signal] = signals("mnist", "optimizers")
    assert set(signal.detail["held"]) == trainable and signal.detail["not_held"] == []
    [stale] = signals("stale_optimizer", "optimizers")
    assert stale.detail["held"] == [] and stale.detail["not_held"] == [
        "features.0", "features.2", "head"]


def test_the_ledger_says_what_never_moved_and_the_learning_rates() -> None:
    [signal] = signals("stale_optimizer", "params-unmoved")
    assert signal.detail["modules"] == ["features.0", "features.2", "head"]
    assert signal.detail["moved"] == 0 and signal.detail["looks"][:3] == [[0, 0], [1, 1], [2, 2]]
    [lrs] = signals("stale_optimizer", "optimizer-lrs")
    assert lrs.detail["lr"][0] == 0.1 and lrs.detail["after"][:2] == [0, 1]
    assert signals("mnist", "params-unmoved") == []


def test_eval_backward_is_written_at_its_step() -> None:
    assert [(s.step, s.fqn) for s in signals("eval_mode", "eval-backward")] == [(3, "")]
    assert signals("diff_a", "eval-backward") == []


@pytest.mark.parametrize("name", ["mnist", "exploding"])
def test_grad_zeros_share_is_by_forward_seq_of_a_module_with_children(name: str) -> None:
    found = records(name)
    forwards = {e.seq: e for e in found if isinstance(e, schema.ForwardEvent)}
    fqns = [m.fqn for m in found if isinstance(m, schema.Module)]
    zeros = signals(name, "grad-zeros")
    assert [s.step for s in zeros] == [0, 1, 2]
    for signal in zeros:
        for seq, share in signal.detail["share"].items():
            call = forwards[int(seq)]
            assert call.step == signal.step
            assert any(f.startswith(call.fqn + ".") or (call.fqn == "" and f) for f in fqns)
            assert 0 < share < 1


def test_loss_ops_name_the_loss_and_the_last_module() -> None:
    [signal] = signals("diff_a", "loss-ops")
    assert signal.detail == {"loss": "MseLoss", "ops": [], "out": "Addmm", "last": "fc2"}
    [mnist] = signals("mnist", "loss-ops")
    assert mnist.detail["loss"] == "NllLoss" and "last" not in mnist.detail


def test_nonfinite_weights_follow_the_first_nan_call() -> None:
    [signal] = signals("nan_layer", "nonfinite-weights")
    assert (signal.step, signal.fqn) == (4, "fc1")
    assert signal.detail == {"params": ["weight", "bias"], "dtypes": ["float32"]}

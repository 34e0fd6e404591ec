"""Every real log checked in under ``tests/unit/logs/`` keeps the log's promises: it reads without
warnings; ``seq`` increases; each backward names an earlier forward of its call; steps, step
records and the end record's counts agree with the events read; the wire encoder writes each
record read back to the very line it came from; and ``flow`` adds the data flow, nothing else."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from hooktrace.log import schema
from hooktrace.log.options import Steps
from hooktrace.log.reader import LogReader
from hooktrace.log.wire import Encoder
from unit.logs import LOGS

ROOT = Path(__file__).resolve().parents[3]
NAMES = sorted(p.stem for p in LOGS.glob("*.jsonl"))
#: the header's facts about the machine, made constant by logs/make.py
CONSTANT = {"pid": 1, "hostname": "host", "started": 1700000000.0, "torch": "2.x",
            "python": "3.x"}


@dataclasses.dataclass(frozen=True)
class Read:
    header: schema.Header
    records: list[Any]
    warnings: list[str]
    end: schema.End | None

    @property
    def events(self) -> list[schema.ForwardEvent | schema.BackwardEvent]:
        return [r for r in self.records
                if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent))]

    def of(self, kind: type) -> list[Any]:
        return [r for r in self.records if isinstance(r, kind)]


@functools.cache
def read(name: str, flow: bool = False) -> Read:
    """One checked-in log, read once per session (tests only look)."""
    reader = LogReader(LOGS / f"{name}.jsonl", flow=flow)
    records = list(reader)
    return Read(reader.header, records, reader.warnings, reader.end)


def script(file: str) -> Path:
    """A traced script, by the name a log gives it (relative to the folder it ran in)."""
    for folder in (ROOT / "samples", ROOT / "tests" / "scripts"):
        if (folder / file).is_file():
            return folder / file
    raise AssertionError(f"no script {file}")


def test_the_logs_are_all_here() -> None:
    assert {"mnist", "vae", "gan", "dead_relu", "detached", "exploding", "eval_mode", "frozen",
            "nan_layer", "long_run", "ops", "stale_optimizer", "unused", "crash", "diff_a",
            "diff_lr", "diff_extra", "diff_nan", "diff_rename", "diff_swap", "diff_twice",
            "diff_nostats"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_reads_without_warnings_with_its_header(name: str) -> None:
    log = read(name)
    assert log.warnings == []
    header = log.header
    assert header.schema == schema.SCHEMA_VERSION
    assert header.hooktrace and header.hooktrace != "?"
    assert header.argv and header.argv[0].endswith(".py")
    assert (header.rank, header.local_rank, header.world_size) == (0, 0, 1)
    assert {k: getattr(header, k) for k in CONSTANT} == CONSTANT
    assert {"max_events", "stats", "watch", "steps", "run"} <= set(header.options)
    assert header.dataflow is True
    assert log.end is not None and log.records[-1] == log.end
    assert log.end.status in schema.END_STATUSES


@pytest.mark.parametrize("name", NAMES)
def test_seq_strictly_increases(name: str) -> None:
    seqs = [e.seq for e in read(name).events]
    assert all(a < b for a, b in itertools.pairwise(seqs))
    assert not seqs or seqs[0] == 1


@pytest.mark.parametrize("name", NAMES)
def test_backward_names_an_earlier_forward_of_its_call(name: str) -> None:
    forwards = {e.seq: e for e in read(name).of(schema.ForwardEvent)}
    for e in read(name).of(schema.BackwardEvent):
        f = forwards.get(e.fwd)
        assert f is not None and f.seq < e.seq, e
        assert (f.model, f.fqn, f.call) == (e.model, e.fqn, e.call), e
        assert f.step <= e.step  # a GAN's generator runs a step before its backward
        assert e.grad_input_len == len(e.grad_input_shapes) == len(f.input_shapes)
        assert e.grad_output_len == len(e.grad_output_shapes) == len(f.output_shapes)


@pytest.mark.parametrize("name", NAMES)
def test_events_only_in_recorded_steps_that_ran(name: str) -> None:
    log = read(name)
    assert log.end is not None
    recorded = Steps.parse(log.header.options["steps"])
    ran = [s for s in range(log.end.steps) if s in recorded]
    # forward calls after the last backward pass are of the step that pass would close
    assert {e.step for e in log.events} <= {s for s in range(log.end.steps + 1) if s in recorded}
    assert {e.step for e in log.of(schema.BackwardEvent)} <= set(ran)
    assert [s.step for s in log.of(schema.Step)] == ran
    for record in log.of(schema.ParamGrads) + log.of(schema.Anomaly) + log.of(schema.Signal):
        # a step's call times are its events': of the step tracing stopped in too
        last = log.end.steps + (getattr(record, "kind", "") == schema.SignalKind.CALL_TIMES)
        assert 0 <= record.step < last, record
    assert all(a.step not in recorded for a in log.of(schema.Anomaly))  # watched steps only


@pytest.mark.parametrize("name", NAMES)
def test_end_and_step_records_count_the_events_read(name: str) -> None:
    log = read(name)
    assert log.end is not None
    assert log.end.events == len(log.events)
    assert log.end.dropped is None
    per_step = Counter((e.step, e.phase) for e in log.events)
    for step in log.of(schema.Step):
        assert (step.forward, step.backward) == (per_step[step.step, "forward"],
                                                 per_step[step.step, "backward"])
    closed = {s.step for s in log.of(schema.Step)}
    trailing = [e for e in log.events if e.step not in closed]  # after the last backward pass
    assert all(e.phase == "forward" and e.step == log.end.steps for e in trailing)
    assert sum(s.forward + s.backward for s in log.of(schema.Step)) + len(trailing) == \
        log.end.events


@pytest.mark.parametrize("name", NAMES)
def test_events_name_declared_modules_and_params_their_own(name: str) -> None:
    log = read(name)
    models = {m.model for m in log.of(schema.Model)}
    modules = {(m.model, m.fqn): m for m in log.of(schema.Module)}
    assert {m for m, _ in modules} <= models
    assert {(e.model, e.fqn) for e in log.events} <= set(modules)
    for params in log.of(schema.ParamGrads):
        for fqn in params.grad_norm:
            assert modules[params.model, fqn].params > 0, (params, fqn)


@pytest.mark.parametrize("name", NAMES)
def test_the_encoder_writes_each_record_read_to_its_line(name: str) -> None:
    """Read -> encode -> the same bytes, line by line (the data flow given as the tracer gives
    it, tuples)."""
    log = read(name, flow=True)
    encoder = Encoder()
    written = [orjson.dumps(log.header.to_dict())]
    for record in log.records:
        if isinstance(record, schema.ForwardEvent) and record.inputs_from is not None:
            record = dataclasses.replace(
                record, inputs_from=[tuple(calls) for calls in record.inputs_from])
        written += [orjson.dumps(d) for d in encoder.wire(record)]
    lines = (LOGS / f"{name}.jsonl").read_bytes().splitlines()
    assert len(written) == len(lines)
    for number, (mine, theirs) in enumerate(zip(written, lines, strict=True), 1):
        assert mine == theirs, f"line {number}"


@pytest.mark.parametrize("name", NAMES)
def test_flow_gives_the_same_records_plus_their_data_flow(name: str) -> None:
    plain, flow = read(name).records, read(name, flow=True).records
    assert len(plain) == len(flow)
    forwards = {r.seq for r in flow if isinstance(r, schema.ForwardEvent)}
    for a, b in zip(plain, flow, strict=True):
        if not isinstance(b, schema.ForwardEvent):
            assert repr(a) == repr(b)  # NaN statistics are not equal to themselves
            continue
        assert isinstance(a, schema.ForwardEvent) and a.inputs_from is None and a.made is None
        assert a.from_out is None and a.made_out is None
        assert a == dataclasses.replace(b, inputs_from=None, made=None, from_out=None,
                                        made_out=None)
        assert b.inputs_from is not None and len(b.inputs_from) == len(b.input_shapes)
        for calls in [*b.inputs_from, b.made or [], *(b.made_out or [])]:
            assert list(calls) == sorted(calls)
            assert all(c in forwards and c < b.seq for c in calls), b
        if b.made_out is not None:  # per output, those of ``made``
            assert len(b.made_out) == len(b.output_shapes)
            assert sorted({c for calls in b.made_out for c in calls}) == list(b.made or [])
        if b.from_out is not None:  # per input, one output index per producer
            assert [len(o) for o in b.from_out] == [len(c) for c in b.inputs_from]


@pytest.mark.parametrize("name", sorted({n for n in NAMES if read(n).of(schema.Source)}))
def test_sources_point_at_a_forward(name: str) -> None:
    for source in read(name).of(schema.Source):
        line = script(source.file).read_text(encoding="utf-8").splitlines()[source.line - 1]
        assert line.lstrip().startswith("def forward("), source
    classes = [s.cls for s in read(name).of(schema.Source)]
    assert len(classes) == len(set(classes))  # once per class


# -- what some logs are about ---------------------------------------------------------------------

def test_crash_has_an_error_and_no_events() -> None:
    log = read("crash")
    assert log.events == [] and log.end is not None
    assert (log.end.status, log.end.exit_code, log.end.steps) == ("error", 1, 0)
    assert log.end.error == {"type": "ValueError", "message": "bad value 42",
                             "file": "raise_error.py", "line": 5}
    line = script("raise_error.py").read_text(encoding="utf-8").splitlines()[4]
    assert "ValueError" in line


def test_long_run_records_two_steps_and_watches_the_rest() -> None:
    log = read("long_run")
    assert log.end is not None and log.end.steps == 60
    assert {e.step for e in log.events} == {0, 1}
    anomalies = log.of(schema.Anomaly)
    assert min(a.step for a in anomalies) == 50
    first = [(a.kind, a.fqn) for a in anomalies if a.step == 50]
    assert first == [("nonfinite-forward", "norm"), ("nonfinite-backward", "")]
    assert {a.step for a in anomalies} == set(range(50, 60))


def test_gan_keeps_its_models_apart() -> None:
    log = read("gan")
    assert [(m.model, m.name) for m in log.of(schema.Model)] == [
        (0, "generator"), (1, "discriminator"), (2, "criterion")]
    forwards = {e.seq: e for e in log.of(schema.ForwardEvent)}
    late = {(forwards[e.fwd].step, e.step) for e in log.of(schema.BackwardEvent)
            if e.model == 0}
    assert late == {(0, 1), (2, 3)}  # the generator's backward, a step after its forward
    assert {p.model for p in log.of(schema.ParamGrads)} == {0, 1}  # the loss has no weights


def test_no_stats_log_has_no_statistics() -> None:
    log = read("diff_nostats")
    assert log.header.options["stats"] is False
    backward = log.of(schema.BackwardEvent)
    assert backward and all(e.grad_input_stats is None and e.grad_output_stats is None
                            for e in backward)
    assert log.of(schema.ParamGrads) == []
    assert all(e.grad_output_stats is not None for e in read("diff_a").of(schema.BackwardEvent))


@pytest.mark.parametrize(("name", "first"), [("diff_nan", "poison"), ("nan_layer", "compress")])
def test_nan_logs_mark_the_first_nonfinite_output(name: str, first: str) -> None:
    log = read(name)
    marked = [e for e in log.of(schema.ForwardEvent) if e.output_nonfinite]
    assert (marked[0].step, marked[0].fqn) == (3, first)
    assert not [e for e in log.of(schema.ForwardEvent) if e.step < 3 and e.output_nonfinite]
    stats = [s for e in log.of(schema.BackwardEvent) if e.step >= 3
             for s in e.grad_output_stats or [] if s is not None]
    assert stats and all(len(s) == 4 and s[2] > 0 for s in stats)  # [norm, absmax, nan, inf]


def test_frozen_and_dropout_modules_are_declared() -> None:
    frozen = {m.fqn: m for m in read("frozen").of(schema.Module)}
    assert (frozen["layers.2"].params, frozen["layers.2"].trainable) == (1056, 0)
    drops = {m.fqn: (m.drop, m.drop_unit) for m in read("mnist").of(schema.Module) if m.drop}
    assert drops == {"dropout1": (0.25, "element"), "dropout2": (0.5, "element")}

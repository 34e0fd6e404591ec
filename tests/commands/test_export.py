"""``hooktrace export``: typed columns in pandas, the reader's numbers, NaN logs, ranks, a log
cut off, bad input, and memory that does not grow with the log."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SAMPLES, Traced, events, hooktrace_cmd

from commands.test_multirank import _torchrun
from hooktrace.log import schema
from hooktrace.log.writer import LogWriter
from hooktrace.show.export import COLUMNS, NAMES

pd = pytest.importorskip("pandas")

COUNTS = [name for name in NAMES if name.endswith(("_nan", "_inf"))]
TYPED = {"int": pd.api.types.is_integer_dtype, "float": pd.api.types.is_float_dtype,
         "bool": pd.api.types.is_bool_dtype, "str": pd.api.types.is_string_dtype}


@pytest.fixture(scope="module")
def mnist_log(traced: Traced) -> Path:
    return traced(SAMPLES / "mnist_net.py", "--steps", "2")


@pytest.fixture(scope="module")
def nan_log(traced: Traced) -> Path:
    return traced(SAMPLES / "nan_layer.py")


def read(path: Path) -> pd.DataFrame:
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_json(path, lines=True)


def export(log: Path, out: Path, *more: str) -> pd.DataFrame:
    result = hooktrace_cmd("export", log, "-o", out, *more)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    return read(out)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_columns_are_typed_and_hold_the_logs_numbers(mnist_log: Path, tmp_path: Path,
                                                     fmt: str) -> None:
    frame = export(mnist_log, tmp_path / f"mnist.{fmt}")
    assert tuple(frame.columns) == NAMES
    for name, kind, _ in COLUMNS:
        if name in COUNTS:  # empty in the other phase's rows: pandas reads them as float
            continue
        assert TYPED[kind](frame[name]), (name, frame[name].dtype)
        if kind in ("int", "bool"):
            assert not frame[name].isna().any(), name
    logged = events(mnist_log)
    assert list(frame.seq) == [e.seq for e in logged]
    assert list(frame.phase) == [e.phase for e in logged]
    backward = frame[frame.phase == "backward"].iloc[1]  # fc2: one gradient in, one out
    event = next(e for e in logged if e.seq == backward.seq)
    assert isinstance(event, schema.BackwardEvent) and event.grad_output_stats
    assert (backward.fqn, backward["class"], backward.depth) == ("fc2", "Linear", 1)
    assert backward.grad_output_norm == event.grad_output_stats[0][0]
    assert backward.grad_input_shapes == "8x128" and backward.grad_output_shapes == "8x10"
    first = frame.iloc[0]
    assert (first.input_shapes, first.output_dtypes, first.forward_seq) == (
        "8x1x28x28", "float32", first.seq)
    assert set(frame.model) == {"model"} and set(frame["rank"]) == {0}
    forward_line = next(i for i, line in enumerate(
        (SAMPLES / "mnist_net.py").read_text().splitlines(), 1) if "def forward" in line)
    root = frame[frame.depth == 0]  # Net, a class of the sample's: where its forward is
    assert len(root) and root.source.str.endswith(f"mnist_net.py:{forward_line}").all()
    assert (frame[frame.depth > 0].source.fillna("") == "").all()  # torch's classes: empty


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_nan_inf_counts_are_empty_in_the_other_phase(mnist_log: Path, tmp_path: Path,
                                                     fmt: str) -> None:
    """A forward row has no gradient to count NaN in, a backward row no output: empty (null),
    as docs/reading.md says, not 0; in its own phase a count is a whole number."""
    frame = export(mnist_log, tmp_path / f"mnist.{fmt}")
    for name in COUNTS:
        own = frame.phase == ("forward" if name.startswith("output") else "backward")
        assert frame.loc[~own, name].isna().all(), name
        counted = frame.loc[own, name]
        assert not counted.isna().any() and (counted == counted.round()).all(), name
        assert (counted == 0).all(), name  # the MNIST sample is finite
    if fmt == "jsonl":
        first = json.loads((tmp_path / "mnist.jsonl").read_text().splitlines()[0])
        assert first["phase"] == "forward" and first["output_nan"] == 0
        assert all(first[name] is None for name in COUNTS if name.startswith("grad"))


def test_backward_rows_point_at_their_forward(mnist_log: Path, tmp_path: Path) -> None:
    frame = export(mnist_log, tmp_path / "mnist.csv")
    forward = frame[frame.phase == "forward"].set_index("seq")
    for _, row in frame[frame.phase == "backward"].iterrows():
        assert forward.loc[row.forward_seq, "fqn"] == row.fqn
        assert forward.loc[row.forward_seq, "call"] == row.call


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_sequential_fqns_read_back_as_names(fmt: str, tmp_path: Path) -> None:
    """An ``nn.Sequential``'s modules are named 0, 1, 2: pandas' defaults read them as the
    names they are, and the README's groupby("fqn") keeps each model's root (a GAN's two
    Sequentials; mnist's named layers are the look-alike)."""
    logs = Path(__file__).resolve().parents[1] / "unit" / "logs"
    frame = export(logs / "gan.jsonl", tmp_path / f"gan.{fmt}")
    assert pd.api.types.is_string_dtype(frame.fqn)
    norms = frame.groupby(["model", "fqn"]).grad_output_norm.max()
    assert sorted(norms["generator"].index) == ["(root)", "0", "1", "2", "3"]
    assert list(frame[frame.depth == 0].fqn.unique()) == ["(root)"]
    named = export(logs / "mnist.jsonl", tmp_path / f"mnist.{fmt}").groupby("fqn").size()
    assert set(named.index) == {"(root)", "conv1", "conv2", "dropout1", "dropout2", "fc1", "fc2"}


def test_nan_log_counts_and_non_finite_norms(nan_log: Path, tmp_path: Path) -> None:
    csv_frame = export(nan_log, tmp_path / "nan.csv")
    json_frame = export(nan_log, tmp_path / "nan.out", "--format", "jsonl")
    for frame in (csv_frame, json_frame):
        bad = frame[frame.output_nan > 0]
        assert bad.iloc[0].fqn == "compress" and bad.iloc[0].step == 3
        assert (frame.grad_output_nan > 0).any()
    row = csv_frame[csv_frame.grad_output_nan > 0].iloc[0]
    assert math.isnan(row.grad_output_norm)  # CSV keeps nan; JSON has no NaN: null
    assert json_frame.loc[row.name, "grad_output_norm"] != json_frame.loc[row.name,
                                                                          "grad_output_norm"]


@pytest.mark.slow
def test_two_ranks_one_after_the_other(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 2)
    assert result.returncode == 0, result.stderr
    frame = export(tmp_path / "ddp.rank*.jsonl", tmp_path / "ranks.csv")
    counts = [len(events(tmp_path / f"ddp.rank{r}.jsonl")) for r in (0, 1)]
    assert list(frame["rank"]) == [0] * counts[0] + [1] * counts[1]
    assert set(frame.fqn) == {"(root)", "fc1", "fc2"}


def test_log_cut_off_exports_its_whole_lines(mnist_log: Path, tmp_path: Path) -> None:
    data = mnist_log.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) // 2])
    result = hooktrace_cmd("export", cut, "-o", "-", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert "no end record" in result.stderr
    rows = result.stdout.splitlines()
    assert 0 < len(rows) < len(events(mnist_log))


@pytest.mark.parametrize("case", ["missing", "not a log", "over the log", "format", "empty",
                                  "directory"])
def test_bad_input_is_one_line_and_exit_2(case: str, mnist_log: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    args: list[str | Path] = {
        "missing": [tmp_path / "nope.jsonl"],
        "empty": [tmp_path / "empty.jsonl"],
        "directory": [tmp_path],
        "not a log": [SAMPLES / "mnist_net.py"],
        "over the log": [mnist_log, "-o", mnist_log],
        "format": [mnist_log, "--format", "xlsx"],
    }[case]
    result = hooktrace_cmd("export", *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert mnist_log.read_bytes().startswith(b'{"type":"header"')


def synthetic_log(path: Path, steps: int) -> Path:
    """A Linear/Tanh chain, 20 events a step, by the real writer."""
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0"))
    writer.write(schema.Model(model=0, name="net", cls="Sequential"))
    names = [str(i) for i in range(10)]
    for name in names:
        writer.write(schema.Module(model=0, fqn=name, cls="Linear"))
    seq = 0
    for step in range(steps):
        first = seq + 1
        for name in names:
            seq += 1
            writer.write(schema.ForwardEvent(seq, step, 0, name, 0, [[8, 16]], ["float32"],
                                             [[8, 16]], ["float32"]))
        for i, name in enumerate(reversed(names)):
            seq += 1
            stats = [[0.5 + step % 7, 0.25]]
            writer.write(schema.BackwardEvent(seq, step, 0, name, 0, first + 9 - i, 1, 1,
                                              [[8, 16]], [[8, 16]], False, stats, stats))
        writer.write(schema.Step(step, 10, 10))
    writer.write(schema.End(status="ok", events=seq, steps=steps))
    writer.close()
    return path


def peak_rss_mb(log: Path, out: Path) -> float:
    code = ("import resource, sys; from hooktrace.show.export import write_rows; "
            "write_rows([sys.argv[1]], None, sys.argv[2]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    result = subprocess.run([sys.executable, "-c", code, str(log), str(out)],
                            capture_output=True, text=True, check=True, timeout=300)
    return float(result.stdout)


@pytest.mark.slow
def test_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    small = synthetic_log(tmp_path / "small.jsonl", 100)
    big = synthetic_log(tmp_path / "big.jsonl", 10_000)  # 200,000 events
    small_mb = peak_rss_mb(small, tmp_path / "small.csv")
    big_mb = peak_rss_mb(big, tmp_path / "big.csv")
    assert sum(1 for _ in (tmp_path / "big.csv").open()) == 200_001
    assert big_mb < small_mb + 10, (small_mb, big_mb)

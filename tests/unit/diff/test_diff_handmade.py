"""``diff`` of logs written by hand with the log's writer, one change at a time: the tolerance at
its edge, NaN/Inf in one run or in both, dtypes, renames and what is not a rename, a call
missing, parameter gradients alone, one model of two, a run cut off, other ``--steps``, and
watched steps' anomaly records. Each change has a look-alike that must agree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hooktrace.diff.compare import diff
from hooktrace.diff.report import diff_text
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from unit.logs import LOGS
from unit.show.handlog import Builder, chain

NAMES = ["fc1", "act", "fc2"]


def run(path: Path, norms: list[float] | None = None, *, names: list[str] = NAMES,
        classes: dict[str, str] | None = None, dtype: str = "float32", steps: int = 2,
        first: int = 0, params: dict[str, float | None] | None = None, cut: bool = False,
        recorded: str = "0:10") -> Path:
    """A log of ``steps`` steps (from ``first``) of a model whose modules run in a chain."""
    b = Builder()
    b.model(0, "net", "Net", classes or dict.fromkeys(names, "Linear"))
    for step in range(first, first + steps):
        chain(b, step, names, norms, dtype=dtype, params=params is None)
        if params is not None:
            b.params(step, params)
    if cut:  # the run died inside the next step: its events, no step record, no end
        b.forward(first + steps, names[0])
    return b.write(path, end=not cut, steps=recorded)


@pytest.fixture
def a(tmp_path: Path) -> Path:
    return run(tmp_path / "a.jsonl")


# -- numbers at the tolerance's edge ---------------------------------------------------------------

@pytest.mark.parametrize(("norm", "rtol", "atol", "differ"), [
    (1.0, 0.002, 0.0, False),
    (1.002, 0.002, 0.0, False),  # one rounding step of 4 significant digits
    (1.003, 0.002, 0.0, True),
    (1.003, 0.003, 0.0, False),
    (1.5, 0.002, 0.0, True),
    (1.5, 0.002, 0.5, False),  # atol is added to the relative tolerance
    (0.5, 0.4, 0.0, True),  # relative to the larger of the two: 0.5
    (0.5, 0.5, 0.0, False),
])
def test_tolerance(a: Path, tmp_path: Path, norm: float, rtol: float, atol: float,
                   differ: bool) -> None:
    b = run(tmp_path / "b.jsonl", [1.0, norm, 1.0])
    report = diff(a, b, rtol=rtol, atol=atol)
    assert report.differ == differ
    assert (report.divergence is not None) == differ
    assert bool(report.param_steps) == differ  # the parameter norms moved with it
    if differ:
        d = report.divergence
        assert d is not None
        assert (d.kind, d.step, d.module, d.phase) == ("value", 0, "act", "backward")
        assert d.message == (f"backward of act call 0: grad_output 0 norm differs by "
                             f"{abs(norm - 1) / max(norm, 1):.2g} (relative)")


def test_the_first_divergence_is_the_first_call_in_a_order(a: Path, tmp_path: Path) -> None:
    b = run(tmp_path / "b.jsonl", [1.5, 1.2, 1.0])  # backward runs fc2, act, fc1
    report = diff(a, b)
    assert report.divergence is not None and report.divergence.module == "act"
    assert [(g["step"], g["module"]) for g in report.growth] == [(0, "act"), (0, "fc1"),
                                                                 (1, "fc1")]


# -- NaN/Inf ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_gradient_in_b_only(a: Path, tmp_path: Path, bad: float) -> None:
    report = diff(a, run(tmp_path / "b.jsonl", [1.0, bad, 1.0]))
    d = report.nonfinite
    assert d is not None and d is report.divergence
    assert (d.kind, d.module, d.phase) == ("nonfinite", "act", "backward")
    assert d.message == "backward of act call 0: grad_output 0 has NaN/Inf in B only"
    assert d.a == "norm 1, absmax 0.5"
    assert d.b == ("32 NaN, 0 Inf" if math.isnan(bad) else "0 NaN, 32 Inf")


def test_nonfinite_in_both_runs_agrees(tmp_path: Path) -> None:
    one = run(tmp_path / "a.jsonl", [1.0, math.nan, 1.0])
    two = run(tmp_path / "b.jsonl", [1.0, math.nan, 1.0])
    report = diff(one, two)
    assert not report.differ and report.nonfinite is None


def test_nonfinite_output_in_a_only(tmp_path: Path) -> None:
    b = Builder()
    b.model(0, "net", "Net", {"fc1": "Linear"})
    b.forward(0, "fc1", output_nonfinite=[[0, 2, 0]])
    b.end_step(0, 1, 0)
    bad = b.write(tmp_path / "bad.jsonl")
    good = Builder()
    good.model(0, "net", "Net", {"fc1": "Linear"})
    good.forward(0, "fc1")
    good.end_step(0, 1, 0)
    report = diff(bad, good.write(tmp_path / "good.jsonl"))
    assert report.nonfinite is not None
    assert report.nonfinite.message == "forward of fc1 call 0: output 0 has NaN/Inf in A only"
    assert (report.nonfinite.a, report.nonfinite.b) == ("2 NaN, 0 Inf", "finite")


# -- what ran, shapes and dtypes -------------------------------------------------------------------

def test_dtypes_differ(a: Path, tmp_path: Path) -> None:
    report = diff(a, run(tmp_path / "b.jsonl", dtype="bfloat16"))
    assert report.shapes is not None
    assert (report.shapes.kind, report.shapes.module, report.shapes.position) == ("dtypes",
                                                                                  "fc1", 0)
    assert (report.shapes.a, report.shapes.b) == ("[float32] -> [float32]",
                                                  "[bfloat16] -> [bfloat16]")
    assert report.ran is None and report.divergence is None
    assert "2. shapes and dtypes: dtypes differ" in diff_text(report)


def test_same_class_and_place_is_a_rename(a: Path, tmp_path: Path) -> None:
    report = diff(a, run(tmp_path / "b.jsonl", names=["fc1", "act", "head"]))
    assert report.renamed == [("net", "fc2", "head")]
    assert report.ran is None and report.param_steps == 0  # compared under A's name


def test_another_class_is_not_a_rename(a: Path, tmp_path: Path) -> None:
    b = run(tmp_path / "b.jsonl", names=["fc1", "act", "head"],
            classes={"fc1": "Linear", "act": "Linear", "head": "Conv2d"})
    report = diff(a, b)
    assert report.renamed == []
    assert report.ran is not None and report.ran.message == "forward of head call 0 ran in B only"
    assert report.params[0].modules == [("fc2", 1.0, None), ("head", None, 1.0)]
    assert "fc2 1 vs no gradient, head no gradient vs 1" in diff_text(report)


def test_a_call_missing_in_b(a: Path, tmp_path: Path) -> None:
    report = diff(a, run(tmp_path / "b.jsonl", names=["fc1", "fc2"]))
    assert report.ran is not None
    assert (report.ran.module, report.ran.position) == ("act", 1)
    assert report.ran.message == "forward of act call 0 ran in A only"
    assert report.ran.b == ("forward fc1 #0 · [forward fc2 #0] · forward (root) #0 · "
                            "backward (root) #0 · ...")


# -- parameter gradients alone ---------------------------------------------------------------------

@pytest.mark.parametrize(("norms", "differ"), [
    ({"fc1": 1.0, "act": 1.0, "fc2": 1.0}, False),
    ({"fc1": 1.0, "act": 1.0, "fc2": 2.0}, True),
    ({"fc1": 1.0, "act": 1.0, "fc2": None}, True),  # no gradient reached fc2's parameters
])
def test_parameter_gradients_alone(tmp_path: Path, norms: dict[str, float | None],
                                   differ: bool) -> None:
    one = run(tmp_path / "a.jsonl", params={"fc1": 1.0, "act": 1.0, "fc2": 1.0})
    two = run(tmp_path / "b.jsonl", params=norms)
    report = diff(one, two)
    assert report.differ == differ
    assert report.param_steps == (2 if differ else 0)
    assert report.divergence is None and report.ran is None
    if differ:
        assert report.params[0].modules == [("fc2", 1.0, norms["fc2"])]
        assert "4. parameter-gradient norms: differ in 2 of 2 steps" in diff_text(report)
        assert diff_text(report).endswith("The runs differ: parameter gradients.")


# -- one model of two ------------------------------------------------------------------------------

def two_models(path: Path, teacher_norm: float) -> Path:
    b = Builder()
    b.model(0, "student", "Net", {"fc": "Linear"})
    b.model(1, "teacher", "Net", {"fc": "Linear"})
    chain(b, 0, ["fc"], [1.0], model=0)
    chain(b, 0, ["fc"], [teacher_norm], model=1)
    return b.write(path)


@pytest.mark.parametrize(("model", "differ"), [(None, True), ("teacher", True),
                                               ("student", False)])
def test_model_compares_that_model_only(tmp_path: Path, model: str | None,
                                        differ: bool) -> None:
    report = diff(two_models(tmp_path / "a.jsonl", 1.0), two_models(tmp_path / "b.jsonl", 3.0),
                  model=model)
    assert report.differ == differ
    if differ:
        assert report.divergence is not None and report.divergence.model == "teacher"


# -- steps one log lacks ---------------------------------------------------------------------------

def test_a_run_cut_off_is_compared_up_to_its_last_whole_step(a: Path, tmp_path: Path) -> None:
    report = diff(a, run(tmp_path / "b.jsonl", cut=True))
    assert report.steps == [0, 1] and not report.differ
    assert report.not_compared[0] == "step 2: cut off in B (the run did not finish it)"
    assert report.warnings == [f"{tmp_path / 'b.jsonl'} has no end record: the run did not "
                               "finish"]
    assert f"warning: {tmp_path / 'b.jsonl'} has no end record" in diff_text(report)


def test_other_recorded_steps(tmp_path: Path) -> None:
    long = run(tmp_path / "a.jsonl", steps=4, recorded="0:4")
    short = run(tmp_path / "b.jsonl", steps=2, recorded="0:2")
    report = diff(long, short)
    assert report.steps == [0, 1] and not report.differ
    assert report.not_compared == ["steps 2-3: only in A (B recorded with --steps 0:2)"]


def test_no_step_in_common(tmp_path: Path) -> None:
    early = run(tmp_path / "a.jsonl", steps=2)
    late = run(tmp_path / "b.jsonl", steps=2, first=5)
    with pytest.raises(HooktraceError,
                       match=r"have no step in common \(A: steps 0-1; B: steps 5-6\)$"):
        diff(early, late)


def test_a_run_cut_off_before_it_finished_a_step(a: Path, tmp_path: Path) -> None:
    """B died in step 0: A finished steps 0 and 1, B none (not 'A: steps 1; B: none')."""
    cut = run(tmp_path / "b.jsonl", steps=0, cut=True)
    with pytest.raises(HooktraceError, match=r"have no step in common \(A: steps 0-1; B: cut off "
                                             r"in step 0, before it finished a step\)$"):
        diff(a, cut)


# -- watched steps ---------------------------------------------------------------------------------

def without_anomalies(path: Path) -> Path:
    """long_run.jsonl as a healthy run of the same script leaves it: the same recorded steps,
    and its watched steps 2-59 found nothing, so wrote nothing."""
    lines = (LOGS / "long_run.jsonl").read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(line for line in lines if b'"type":"anomaly"' not in line))
    return path


def test_watched_anomalies_agree_with_themselves() -> None:
    report = diff(LOGS / "long_run.jsonl", LOGS / "long_run.jsonl")
    assert not report.differ and report.steps == [0, 1, *range(50, 60)]


def test_a_watched_anomaly_in_one_run_only_where_both_have_the_step(tmp_path: Path) -> None:
    def watched(path: Path, anomaly: bool) -> Path:
        b = Builder()
        b.model(0, "net", "Net", dict.fromkeys(NAMES, "Linear"))
        chain(b, 0, NAMES)
        b.records.append(schema.Anomaly(step=5, model=0, fqn="act", kind="no-grad"))
        if anomaly:
            b.records.append(schema.Anomaly(step=5, model=0, fqn="fc2",
                                            kind="nonfinite-forward"))
        return b.write(path, steps="0:1")

    report = diff(watched(tmp_path / "a.jsonl", False), watched(tmp_path / "b.jsonl", True))
    d = report.nonfinite
    assert d is not None and d is report.divergence
    assert (d.step, d.module, d.phase) == (5, "fc2", "forward")
    assert d.message == "nonfinite-forward anomaly in B only (a watched step)"
    assert not diff(watched(tmp_path / "c.jsonl", False), tmp_path / "a.jsonl").differ


def test_nan_at_a_watched_step_in_one_run_only(tmp_path: Path) -> None:
    report = diff(without_anomalies(tmp_path / "healthy.jsonl"), LOGS / "long_run.jsonl")
    assert report.differ
    assert report.nonfinite is not None and report.nonfinite.step == 50
    assert report.nonfinite.message == "nonfinite-backward anomaly in B only (a watched step)"
    assert report.steps == [0, 1, *range(50, 60)] and report.not_compared == []
    back = diff(LOGS / "long_run.jsonl", tmp_path / "healthy.jsonl").nonfinite
    assert back is not None and back.message.endswith("in A only (a watched step)")


def test_healthy_watched_steps_agree(tmp_path: Path) -> None:
    healthy = without_anomalies(tmp_path / "healthy.jsonl")
    report = diff(healthy, healthy)
    assert not report.differ and report.steps == [0, 1] and report.not_compared == []


def test_nan_at_a_step_the_other_run_never_reached_is_not_compared(tmp_path: Path) -> None:
    """A healthy run cut off after its recorded steps did not watch step 50: no verdict."""
    healthy = without_anomalies(tmp_path / "healthy.jsonl")
    lines = healthy.read_bytes().splitlines(keepends=True)
    healthy.write_bytes(b"".join(line for line in lines if b'"type":"end"' not in line))
    report = diff(healthy, LOGS / "long_run.jsonl")
    assert not report.differ
    assert report.not_compared == ["steps 50-59: only in B (A recorded with --steps 0:2)"]

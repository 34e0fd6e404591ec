"""``hooktrace check`` on real logs: each defect sample in samples/ is traced with the real
``hooktrace run`` and checked with the real ``hooktrace check`` (subprocesses), and the report must
name exactly that defect: its kind, module and step, and no other problem (severity error or
warning) unless the defect causes it. Healthy training scripts must give no problem at all.

Each traced run imports torch (a few seconds), so every sample is traced once per module
(the ``*_log`` fixtures) and its log shared by the tests that read it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES, Traced, hooktrace_cmd

from hooktrace.check.checklog import run_checks
from hooktrace.log import schema
from hooktrace.log.writer import LogWriter
from hooktrace.observe.stats import DEFER_ENV

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PROBLEM = ("error", "warning")
REPORT_KEYS = {"problems", "steps", "events", "warnings", "findings", "models"}
FINDING_KEYS = {"kind", "cause", "severity", "model", "module", "step", "message", "evidence",
                "hint", "ranks", "source"}

Run = subprocess.CompletedProcess[str]


# -- helpers -----------------------------------------------------------------------------------

def trace(cwd: Path, script: Path, *args: str, name: str | None = None) -> Path:
    """``hooktrace run -o LOG SCRIPT ARGS`` in ``cwd``; the run must succeed."""
    log = cwd / f"{name or script.stem}.jsonl"
    result = hooktrace_cmd("run", "-o", log, script, *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "step 0:" in result.stdout  # the script itself ran
    return log


def ran(log: Path) -> Path:
    """A shared traced log (the ``traced`` fixture), once its script is seen to have run."""
    assert "step 0:" in log.with_suffix(".stdout").read_text()  # the script itself ran
    return log


def check(log: Path, *args: str | int) -> Run:
    return hooktrace_cmd("check", log, *map(str, args))


def check_json(log: Path, *args: str | int) -> tuple[int, dict[str, Any]]:
    """Exit status and parsed report of ``hooktrace check LOG --json ARGS``."""
    result = check(log, "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert set(report) == REPORT_KEYS, report.keys()
    for finding in report["findings"]:
        assert set(finding) == FINDING_KEYS, finding.keys()
        assert finding["severity"] in ("error", "warning", "note")
    # the count of problems agrees with the findings and with the exit status
    assert report["problems"] == len(problems(report))
    assert result.returncode == (1 if report["problems"] else 0)
    return result.returncode, report


def problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] in PROBLEM]


def summary(findings: list[dict[str, Any]]) -> set[tuple[str, str, str, int | None]]:
    """(kind, severity, module, step) of each finding: what a test compares."""
    return {(f["cause"], f["severity"], f["module"], f["step"]) for f in findings}


def assert_user_error(result: Run) -> None:
    """Bad input: exit 2, one line ``hooktrace: error: ...`` on stderr, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hooktrace: error: "), lines[0]
    assert result.stdout == ""


# -- the traced samples, once per module --------------------------------------------------------

@pytest.fixture(scope="module")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("check")


@pytest.fixture(scope="module")
def detached_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "detached_branch.py"))


@pytest.fixture(scope="module")
def frozen_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "frozen_by_mistake.py"))


@pytest.fixture(scope="module")
def nan_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "nan_layer.py"))


@pytest.fixture(scope="module")
def exploding_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "exploding.py"))


@pytest.fixture(scope="module")
def unused_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "unused_module.py"))


@pytest.fixture(scope="module")
def mnist_log(traced: Traced) -> Path:
    return ran(traced(SAMPLES / "mnist_net.py"))  # 3 steps


# -- one defect each -----------------------------------------------------------------------------

def test_detached_branch(detached_log: Path) -> None:
    status, report = check_json(detached_log)
    assert status == 1
    assert report["steps"] == 3
    # one finding, naming where the gradient is lost: the model's own forward, which detaches
    # branch_b's output; both Linear layers of branch_b (the ReLU and the Sequential have no
    # parameters) are its evidence, from the first step on; nothing about branch_a
    assert summary(problems(report)) == {("no-grad", "warning", "", 0)}
    (finding,) = problems(report)
    assert finding["model"] == "model"
    assert "the output of branch_b gets no gradient back" in finding["message"]
    assert finding["evidence"]["starved"] == ["branch_b.0", "branch_b.2"]
    assert finding["evidence"]["steps"] == [0, 1, 2]  # every step, not only the first


def test_frozen_by_mistake(frozen_log: Path) -> None:
    status, report = check_json(frozen_log)
    assert status == 1
    # a warning (not a note): its siblings of the same class train; frozen is not per step
    assert summary(problems(report)) == {("frozen", "warning", "layers.2", None)}
    [finding] = problems(report)
    assert sorted(finding["evidence"]["trainable_siblings"]) == ["layers.0", "layers.1",
                                                                 "layers.3"]


def test_nan_layer(nan_log: Path) -> None:
    status, report = check_json(nan_log)
    assert status == 1
    forward = [f for f in problems(report) if f["cause"] == "nonfinite-forward"]
    assert summary(forward) == {("nonfinite-forward", "error", "compress", 3)}
    assert forward[0]["evidence"]["outputs"][0]["nan"] > 0
    # The NaN output makes the loss NaN, so the backward pass of step 3 is NaN too: a second,
    # natural finding. Its gradient is NaN as soon as it leaves the loss, so it is first seen on
    # the path from the loss back to compress (today: the root module); never an earlier step.
    # Nothing else: the NaN weights of steps 4.. are "again in steps ..." of the same findings.
    backward = [f for f in problems(report) if f["cause"] == "nonfinite-backward"]
    assert [(f["severity"], f["step"]) for f in backward] == [("error", 3)]
    assert backward[0]["module"] in ("", "fc2", "compress")
    assert len(problems(report)) == 2


def test_exploding(exploding_log: Path) -> None:
    status, report = check_json(exploding_log)
    assert status == 1
    found = problems(report)
    assert found
    # only exploding gradients, seen at the first step (clipping keeps the run finite), all in
    # the 30-layer stack; and no vanishing/NaN misreading of the same stack
    assert {(f["cause"], f["severity"], f["step"]) for f in found} == {("exploding", "warning", 0)}
    layers = {f"layers.{i}" for i in range(30)}
    assert {f["module"] for f in found} <= layers
    # the gradient grows from the output side back to the input side: the finding that compares
    # layers points at the first layer, where the gradient is largest
    profile = [f for f in found if "profile" in f["evidence"]]
    assert [f["module"] for f in profile] == ["layers.0"]
    norms = [p["grad_output_norm"] for p in profile[0]["evidence"]["profile"]]
    assert norms[-1] / norms[0] > 1e4


def test_unused_module(unused_log: Path) -> None:
    status, report = check_json(unused_log)
    assert status == 1
    assert summary(problems(report)) == {("unused", "warning", "aux_head", None)}
    [finding] = problems(report)
    assert finding["evidence"]["trainable"] == 32 * 2 + 2


# -- what real models do is not a defect --------------------------------------------------------

@pytest.mark.parametrize("unused", [False, True], ids=["healthy", "unused"])
@pytest.mark.parametrize("stats", [True, False], ids=["stats", "no-stats"])
def test_transformer_habits_are_not_defects(tmp_path: Path, stats: bool, unused: bool) -> None:
    """MultiheadAttention never calls its out_proj (it uses its weight), the head is zero-
    initialised (no gradient reaches the layers before it at step 0 only), a block holds an
    empty Sequential placeholder: none of it is a problem. A Linear that is never used still is,
    with statistics and without."""
    log = tmp_path / "transformer.jsonl"
    result = hooktrace_cmd("run", "-o", log, *(() if stats else ("--no-stats",)),
                           SCRIPTS / "transformer_train.py", *(("--unused",) if unused else ()),
                           cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    status, report = check_json(log)
    if unused:
        assert summary(problems(report)) == {("unused", "warning", "aux", None)}
    else:
        assert problems(report) == [] and status == 0
    assert [f["module"] for f in report["findings"] if f["cause"] == "unused"] == (
        ["aux"] if unused else [])
    if stats:  # the step-0 zero gradients: a note naming the head, at that step only
        [note] = [f for f in report["findings"] if f["cause"] == "zero-gradient"]
        assert (note["severity"], note["module"], note["step"]) == ("note", "head", 0)
        assert note["evidence"]["steps"] == [0]
        assert note["evidence"]["starved"][0] == "embed"  # in execution order
        assert "not in the 3 later steps" in note["message"]
        # its victims are its evidence, not vanishing findings of their own (out_proj, whose
        # parameters MultiheadAttention uses without calling it, included)
        assert [f for f in report["findings"] if f["cause"] == "vanishing"] == []


def test_lasting_vanishing_is_a_problem(tmp_path: Path) -> None:
    """The same zero head, never trained (learning rate 0): no gradient ever gets past it, at
    any step: a warning naming the head, not a note."""
    script = tmp_path / "frozen_lr.py"
    script.write_text((SCRIPTS / "transformer_train.py").read_text().replace("lr=1e-2", "lr=0.0"))
    status, report = check_json(trace(tmp_path, script))
    # and the weights that the learning rate of 0 leaves as they are
    assert summary(problems(report)) == {("zero-gradient", "warning", "head", 0),
                                         ("weights-unchanged", "warning", "", 0)}
    [finding] = [f for f in problems(report) if f["cause"] == "zero-gradient"]
    assert finding["evidence"]["steps"] == [0, 1, 2, 3]
    [unchanged] = [f for f in problems(report) if f["cause"] == "weights-unchanged"]
    assert unchanged["message"].endswith(": the optimizer's learning rate is 0")
    assert status == 1


@pytest.mark.parametrize("shortcut", [True, False], ids=["shortcut", "no-shortcut"])
def test_small_gradients_inside_a_branch(tmp_path: Path, shortcut: bool) -> None:
    """A residual branch scaled by a tiny layer scale gets tiny parameter gradients while the
    stem, before it, gets a healthy one through the shortcut: a note. Without the shortcut the
    gradient vanishes on its way to the stem: a warning. The Dropouts the blocks never call are
    one note."""
    log = trace(tmp_path, SCRIPTS / "layer_scale.py", *(() if shortcut else ("--no-shortcut",)))
    status, report = check_json(log)
    vanishing = [f for f in report["findings"] if f["cause"] == "vanishing"]
    if shortcut:
        assert problems(report) == [] and status == 0
        [note] = vanishing
        assert (note["severity"], note["module"], note["step"]) == ("note", "1.mlp.0", 0)
        assert "while modules that run before them got larger gradients" in note["message"]
        assert set(note["evidence"]["grad_norm"]) == {f"{b}.mlp.{i}" for b in (1, 2, 3)
                                                      for i in (0, 2)}
    else:
        # the gradient shrinks first at the last block, on its way back: the boundary, with
        # the blocks before it and the stem as its evidence
        assert summary(problems(report)) == {("vanishing", "warning", "3", 0)}
        [finding] = problems(report)
        assert finding["evidence"]["starved"][0] == "0"
    [unused] = [f for f in report["findings"] if f["cause"] == "unused"]
    assert (unused["severity"], unused["evidence"]["modules"]) == ("note",
                                                                   ["1.drop", "2.drop", "3.drop"])


@pytest.mark.parametrize("scaler", [True, False], ids=["scaler", "no-scaler"])
def test_loss_scaler_overflow_is_a_note(tmp_path: Path, scaler: bool) -> None:
    """fp16 with torch.amp.GradScaler: its first steps' scaled gradients overflow to Inf and it
    skips them, then trains on: a note, not an error. (It skips steps 0-11; in 10 and 11, which
    are watched, only weight gradients overflow: a watched step reads them in one fused norm.)
    Without the scaler the Inf gradients are applied and the run stays NaN: errors."""
    log = trace(tmp_path, SCRIPTS / "loss_scaling.py", *(() if scaler else ("--no-scaler",)))
    status, report = check_json(log)
    backward = [f for f in report["findings"] if f["cause"] == "nonfinite-backward"]
    if scaler:
        assert problems(report) == [] and status == 0
        [note] = backward
        assert (note["severity"], note["step"], note["module"]) == ("note", 0, "")
        assert note["evidence"]["steps"] == list(range(12))
        assert "as a loss scaler (torch.amp.GradScaler) skips a step" in note["message"]
    else:
        assert status == 1
        assert {(f["cause"], f["severity"]) for f in problems(report)} == {
            ("nonfinite-forward", "error"), ("nonfinite-backward", "error")}
        assert [f["step"] for f in backward] == [0]


# -- the text report -----------------------------------------------------------------------------

@pytest.mark.parametrize(("fixture", "kind", "module", "step"), [
    ("detached_log", "no-grad", "(root)", 0),
    ("frozen_log", "frozen", "layers.2", None),
    ("nan_log", "nonfinite-forward", "compress", 3),
    ("exploding_log", "exploding", "layers.0", 0),
    ("unused_log", "unused", "aux_head", None),
])
def test_text_report_names_module_and_step(request: pytest.FixtureRequest, fixture: str,
                                           kind: str, module: str, step: int | None) -> None:
    log = request.getfixturevalue(fixture)
    result = check(log)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    # the finding's first line: its kind, the module (a whole word) and the step
    word = re.compile(rf"(?<![\w.(]){re.escape(module)}(?![\w.)])")
    lines = [line for line in result.stdout.splitlines()
             if f"[{kind}]" in line and word.search(line)]
    assert lines, result.stdout
    if step is not None:
        assert any(re.search(rf"\bstep {step}\b", line) for line in lines), lines
    assert "No problems found" not in result.stdout
    assert re.match(r"\d+ problems? \(\d+ errors?, \d+ warnings?\)", result.stdout.splitlines()[-1])


# -- healthy runs --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet18_log(traced: Traced) -> Path:
    return ran(traced(SCRIPTS / "resnet18_train.py"))


@pytest.mark.parametrize("fixture", ["mnist_log", pytest.param("resnet18_log",
                                                               marks=pytest.mark.slow)])
def test_healthy_run_has_no_problems(request: pytest.FixtureRequest, fixture: str) -> None:
    log = request.getfixturevalue(fixture)
    status, report = check_json(log)
    assert problems(report) == [], problems(report)
    assert status == 0
    assert report["steps"] == (3 if fixture == "mnist_log" else 2)
    text = check(log)
    assert text.returncode == 0, text.stderr
    assert "No problems found" in text.stdout.splitlines()[-1]


# -- --step --------------------------------------------------------------------------------------

def test_step_restricts_to_one_step(nan_log: Path) -> None:
    # before the NaN: nothing to report
    status, report = check_json(nan_log, "--step", 2)
    assert (status, problems(report)) == (0, [])
    text = check(nan_log, "--step", 2)
    assert text.returncode == 0
    assert "No problems found" in text.stdout
    # the step of the NaN itself
    status, report = check_json(nan_log, "--step", 3)
    assert status == 1
    assert ("nonfinite-forward", "error", "compress", 3) in summary(problems(report))
    # one step later the SGD update has put NaN into fc1's weights: within step 4 alone, fc1 is
    # the first module with a NaN output, and nothing of step 3 may leak in
    status, report = check_json(nan_log, "--step", 4)
    assert status == 1
    assert ("nonfinite-forward", "error", "fc1", 4) in summary(problems(report))
    assert {f["step"] for f in report["findings"]} <= {4, None}


def test_step_not_in_log_is_an_error(mnist_log: Path) -> None:
    assert_user_error(check(mnist_log, "--step", 999))
    assert_user_error(check(mnist_log, "--json", "--step", 999))


# -- bad input -----------------------------------------------------------------------------------

BAD_INPUTS = {
    "missing": None,
    "directory": None,
    "empty": b"",
    "text": b"hello\nthis is not a log\n",
    "json-not-lines": b'{\n  "type": "header",\n  "schema": 1\n}\n',
    "json-array": b'[{"type": "header", "schema": 1}]\n',
    "binary": bytes(range(256)) * 4,
    "broken-line-inside": (b'{"type": "header", "schema": 1, "hooktrace": "0.1.0"}\n'
                           b'{"type": "model", "model": 0, "name": "m", "class": "M"}\n'
                           b'this line is not JSON\n'
                           b'{"type": "step", "step": 0}\n'
                           b'{"type": "end", "status": "ok"}\n'),
}


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
@pytest.mark.parametrize("as_json", [False, True])
def test_bad_input(tmp_path: Path, kind: str, as_json: bool) -> None:
    path = tmp_path / f"{kind}.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind != "missing":
        path.write_bytes(BAD_INPUTS[kind])  # type: ignore[arg-type]
    assert_user_error(check(path, *(["--json"] if as_json else [])))


# -- a long run: full events for the first steps, then anomalies only ---------------------------

@pytest.mark.slow
def test_long_run_finds_late_nan_in_small_log(traced: Traced) -> None:
    # what the watched steps cost is measured by the benchmark (bench/, watched steps)
    log = ran(traced(SAMPLES / "long_run.py"))  # 2000 steps, NaN from step 1800
    # the default recording keeps the log small: full events for the first steps only
    assert log.stat().st_size < 2 * 1024 * 1024, log.stat().st_size

    status, report = check_json(log)
    assert status == 1
    assert report["steps"] == 2000
    forward = [f for f in problems(report) if f["cause"] == "nonfinite-forward"]
    assert summary(forward) == {("nonfinite-forward", "error", "norm", 1800)}
    # as in nan_layer: the NaN loss makes step 1800's backward NaN too; nothing else (the steps
    # past the fully recorded ones must not look like modules without gradient)
    assert {f["cause"] for f in problems(report)} == {"nonfinite-forward", "nonfinite-backward"}
    backward = [f for f in problems(report) if f["cause"] == "nonfinite-backward"]
    assert [f["step"] for f in backward] == [1800]

    text = check(log)
    assert text.returncode == 1
    assert any("[nonfinite-forward]" in line and "norm" in line and "step 1800" in line
               for line in text.stdout.splitlines()), text.stdout


@pytest.mark.parametrize(("script", "args", "module", "step"), [
    ("nan_layer.py", (), "compress", 3),
    ("long_run.py", ("--steps", "300", "--nan-step", "250"), "norm", 250),  # a watched step
])
def test_nan_found_on_the_device_path(tmp_path: Path, script: str, args: tuple[str, ...],
                                      module: str, step: int) -> None:
    """The statistics' accelerator path (numbers kept as tensors until the step ends, NaN
    counted after a second transfer), run on CPU tensors: the same first NaN, same step."""
    log = tmp_path / "device.jsonl"
    result = hooktrace_cmd("run", "-o", log, SAMPLES / script, *args,
                           env={**os.environ, DEFER_ENV: "1"})
    assert result.returncode == 0, result.stderr
    status, report = check_json(log)
    assert status == 1
    forward = [f for f in problems(report) if f["cause"] == "nonfinite-forward"]
    assert summary(forward) == {("nonfinite-forward", "error", module, step)}
    assert forward[0]["evidence"]["outputs"][0]["nan"] + forward[0]["evidence"]["outputs"][0][
        "inf"] > 0


# -- hand-made logs: steps counted once per distinct step, backward paired across steps ----------

def write_log(path: Path, events: list[schema.Record], models: tuple[str, ...] = ("net",)
              ) -> Path:
    """A log by the real writer: each model a Sequential of two trainable Linear layers."""
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0"))
    for model, name in enumerate(models):
        writer.write(schema.Model(model=model, name=name, cls="Sequential"))
        for fqn, params in (("", 0), ("0", 10), ("1", 10)):
            writer.write(schema.Module(model=model, fqn=fqn, cls="Linear" if fqn else
                                       "Sequential", params=params, trainable=params))
    for record in events:
        writer.write(record)
    writer.write(schema.End(status="ok"))
    writer.close()
    return path


class Steps:
    """Events of training steps, numbered as the tracer numbers them."""

    def __init__(self) -> None:
        self.seq = 0
        self.events: list[schema.Record] = []

    def forward(self, step: int, name: str, call: int = 0, model: int = 0) -> int:
        self.seq += 1
        self.events.append(schema.ForwardEvent(self.seq, step, model, name, call, [[2, 3]],
                                               ["float32"], [[2, 3]], ["float32"]))
        return self.seq

    def backward(self, step: int, name: str, fwd: int, model: int = 0) -> None:
        self.seq += 1
        self.events.append(schema.BackwardEvent(
            self.seq, step, model, name, 0, fwd, 1, 1, [[2, 3]], [[2, 3]],
            grad_input_stats=[[1.0, 0.5]], grad_output_stats=[[1.0, 0.5]]))

    def step(self, step: int, detached: tuple[str, ...] = (), twice: str = "") -> None:
        """Forward 0, 1, root; backward root, 1, 0, but for the ``detached``."""
        calls = [(name, self.forward(step, name)) for name in ("0", "1", "")]
        if twice:
            calls.append((twice, self.forward(step, twice, call=1)))
        for name, seq in reversed(calls):
            if name not in detached:
                self.backward(step, name, seq)
        self.events.append(schema.ParamGrads(step, 0, {"0": 1.0, "1": 1.0}))
        self.events.append(schema.Step(step))


def findings(log: Path, step: int | None = None) -> list[tuple[str, str, int | None, Any]]:
    report = run_checks(log, step)
    return [(f.cause, f.module, f.step, f.evidence.get("steps") or f.evidence.get("modules"))
            for f in report.findings]


def test_repeated_steps_and_the_steps_that_differ(tmp_path: Path) -> None:
    """A training loop repeats one step: the steps that differ must still be found, each."""
    steps = Steps()
    for step in range(40):
        steps.step(step, detached=("1",) if step in (7, 21, 22) else (),
                   twice="0" if step == 30 else "")
    log = write_log(tmp_path / "loop.jsonl", steps.events)
    # module 1's output detached inside the root's forward: the root is where it is lost
    assert findings(log) == [("no-grad", "", 7, [7, 21, 22]),
                             ("called-several-times", "0", None, {"0": 2})]
    assert findings(log, 21) == [("no-grad", "", 21, [21])]
    assert findings(log, 30) == [("called-several-times", "0", None, {"0": 2})]
    report = run_checks(log)
    assert (report.steps, report.events) == (0, 0)  # as the end record says


def test_backward_in_a_later_step_belongs_to_its_forward(tmp_path: Path) -> None:
    """A GAN's generator: its forward in one step, its backward in the next; but a backward
    more than two steps after its forward counts for its own step (the reader forgets). The
    rest of the generator trains in that step: a model starved as a whole in a step is trained
    in turns, not detached."""
    steps = Steps()
    gen = steps.forward(0, "0", model=1)
    disc = steps.forward(0, "0")
    steps.backward(0, "0", disc)
    steps.events.append(schema.Step(0))
    disc = steps.forward(1, "0")
    steps.backward(1, "0", disc)
    steps.backward(1, "0", gen, model=1)  # the generator's: one step after its forward
    steps.events.append(schema.Step(1))
    late = steps.forward(2, "0", model=1)
    root = steps.forward(2, "", model=1)
    for step in range(2, 7):
        disc = steps.forward(step, "0")
        steps.backward(step, "0", disc)
        if step == 2:  # the rest of the generator gets its gradient in step 2
            steps.backward(2, "", root, model=1)
        steps.events.append(schema.Step(step))
    steps.backward(6, "0", late, model=1)  # four steps late
    log = write_log(tmp_path / "gan.jsonl", steps.events, models=("disc", "gen"))
    no_grad = [f for f in run_checks(log).findings if f.cause == "no-grad"]
    assert [(f.model, f.module, f.evidence["steps"]) for f in no_grad] == [("gen", "0", [2])]

"""A run hooktrace did not see is a finding, not a pass, on hand-written logs: backward passes
with no module call, a script that exited non-zero before any model ran, a script with no
``nn.Module``, compiled code unseen, every call filtered out; and the look-alikes that are
healthy (a run with events, a killed run, an error the crash check says). Compiled code run
eagerly in recorded steps is one note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hooktrace.check import report
from hooktrace.check.checklog import run_checks
from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.log.writer import LogWriter

from .logbuild import findings, header, healthy, signal, summary, write_log


def empty_log(path: Path, *, models: int = 0, end: str | None = "ok", exit_code: int = 0,
              error: dict[str, Any] | None = None, backward: int | None = None,
              compiled: int | None = None, end_steps: int = 0, **options: Any) -> Path:
    """A log with no event: a header, ``models`` model records, an end record."""
    writer = LogWriter(path)
    writer.write(header(**options))
    for i in range(models):
        writer.write(schema.Model(model=i, name=f"net{i or ''}", cls="Net"))
        writer.write(schema.Module(model=i, fqn="", cls="Net", params=10, trainable=10))
    if end is not None:
        writer.write(schema.End(status=end, exit_code=exit_code, error=error,
                                backward=backward, compiled=compiled, steps=end_steps))
    writer.close()
    return path


def only(path: Path) -> Any:
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == (
        "nothing-traced", "error", "", "", None)
    return f


def test_backward_passes_without_module_calls_are_an_error(tmp_path: Path) -> None:
    f = only(empty_log(tmp_path / "log.jsonl", backward=5))
    assert f.message.startswith("backward() ran 5 times but no nn.Module call was seen: the "
                                "model is not an nn.Module")
    assert f.evidence["backward"] == 5


def test_a_script_that_exited_non_zero_before_any_model_ran(tmp_path: Path) -> None:
    path = empty_log(tmp_path / "log.jsonl", end="error", exit_code=2, error={
        "type": "SystemExit", "message": "2", "file": "train.py", "line": 7,
        "code": "args = parser.parse_args()"})
    f = only(path)
    assert f.message == ("the script exited with status 2 before any model ran "
                         "(train.py:7: args = parser.parse_args())")
    text = report.to_text(run_checks(path), str(path))
    assert "[nothing-traced] the whole run" in text and "No problems found" not in text


def test_a_script_with_no_module_is_an_error(tmp_path: Path) -> None:
    f = only(empty_log(tmp_path / "log.jsonl"))
    assert f.message == "the script finished without calling any nn.Module: nothing to check"


def test_compiled_code_unseen_is_named(tmp_path: Path) -> None:
    f = only(empty_log(tmp_path / "log.jsonl", backward=3, compiled=2))
    assert f.message == ("torch.compile'd code ran (2 graphs compiled) and no module call in "
                         "it was recorded (--steps 0:10)")


def test_compiled_steps_counted_but_only_watched_are_unseen(tmp_path: Path) -> None:
    """Steps of compiled code are counted at backward()'s return; watched steps of a model no
    step ran eagerly judged nothing: still nothing traced. Watched steps of an eager model
    judged its modules: their anomalies are the findings."""
    f = only(empty_log(tmp_path / "a.jsonl", models=1, backward=2, compiled=1, end_steps=2))
    assert f.message.startswith("torch.compile'd code ran (1 graph compiled)")
    eager = empty_log(tmp_path / "b.jsonl", models=1, backward=2, end_steps=2)
    assert "nothing-traced" not in [x.cause for x in findings(eager)]


def test_calls_all_left_out_by_include_say_so(tmp_path: Path) -> None:
    f = only(empty_log(tmp_path / "log.jsonl", models=1, backward=3, include=["decoder*"]))
    assert f.message == ("every module call was left out by --include decoder* (1 model "
                         "seen): no fqn matched")


def test_steps_never_reached_say_so(tmp_path: Path) -> None:
    f = only(empty_log(tmp_path / "log.jsonl", models=1, backward=3, steps="5:"))
    assert f.message.startswith("no step that --steps 5: selects ran")


def test_healthy_look_alikes_get_no_such_finding(tmp_path: Path) -> None:
    assert "nothing-traced" not in [s[0] for s in summary(write_log(
        tmp_path / "a.jsonl", healthy(2)))]
    # killed (no end record) and an error of the script's own: the crash check says them
    assert [f.cause for f in findings(empty_log(tmp_path / "b.jsonl", end=None))] == ["stopped"]
    path = empty_log(tmp_path / "c.jsonl", end="error", exit_code=1, error={
        "type": "ValueError", "message": "bad", "file": "train.py", "line": 3})
    assert [f.cause for f in findings(path)] == ["script-error"]
    # sys.exit(0) before any model: finished, yet nothing was seen
    path = empty_log(tmp_path / "d.jsonl", error={"type": "SystemExit", "message": "0"})
    assert only(path).message.startswith("the script finished without calling any nn.Module")


def test_compiled_code_run_eagerly_is_one_note(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(3), signals=[signal("compiled-eager")])
    notes = [f for f in findings(path) if f.cause == "compiled-eager"]
    assert [(f.severity, f.model, f.module) for f in notes] == [("note", "net", "")]
    assert "ran torch.compile'd code eagerly" in notes[0].message
    assert not run_checks(path).problems


def test_the_new_fields_read_back_and_old_logs_still_read(tmp_path: Path) -> None:
    path = empty_log(tmp_path / "log.jsonl", backward=4, compiled=1)
    reader = LogReader(path)
    ends = [r for r in reader if isinstance(r, schema.End)]
    assert (ends[0].backward, ends[0].compiled, reader.header.eager) == (4, 1, False)
    old = tmp_path / "old.jsonl"  # before them: no such keys, nothing else changes
    old.write_text(path.read_text().replace(',"backward":4,"compiled":1', ""))
    assert "backward" not in old.read_text()
    ends = [r for r in LogReader(old) if isinstance(r, schema.End)]
    assert (ends[0].backward, ends[0].compiled) == (None, None)

"""A run that did not finish, on hand-built logs: the error it stopped on (in a forward, in a
backward pass, in the script before or after a model ran), a kill or an interrupt; and the
look-alikes that finished (``sys.exit``); plus how an error message is put on one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hooktrace.check.crash import message_text

from .logbuild import findings, header, healthy, summary, write_log

INPLACE = ("one of the variables needed for gradient computation has been modified by an "
           "inplace operation: [torch.FloatTensor [4, 8]], which is output 0 of ReluBackward0, "
           "is at version 1; expected version 0 instead")


def crashed(tmp_path: Path, steps: int = 2, **kw: Any) -> Path:
    return write_log(tmp_path / "log.jsonl", healthy(steps), **kw)


def test_an_error_in_a_forward_names_its_module(tmp_path: Path) -> None:
    path = crashed(tmp_path, end="error", error={
        "type": "RuntimeError", "message": "mat1 and mat2 shapes cannot be multiplied",
        "model": 0, "module": "fc2", "file": "train.py", "line": 12})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == (
        "forward-error", "error", "net", "fc2", 2)
    assert f.evidence == {"error": "RuntimeError", "line": "train.py:12"}
    assert f.message == ("the script stopped at step 2: fc2 (Linear) raised RuntimeError in its "
                         "forward (train.py:12): mat1 and mat2 shapes cannot be multiplied")


def test_an_error_in_a_backward_pass_names_the_backward_that_ran(tmp_path: Path) -> None:
    path = crashed(tmp_path, end="error", unfinished=True,
                   error={"type": "RuntimeError", "message": INPLACE})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("backward-error", "error", "fc1", 1)
    assert "an in-place operation" in f.hint
    assert "--ops fc1" in f.evidence["rerun"]


def test_an_unfinished_backward_is_not_judged_for_lost_gradients(tmp_path: Path) -> None:
    """The raising pass starves every module before it; only the error is said."""
    path = crashed(tmp_path, 3, end="error", unfinished=True,
                   error={"type": "RuntimeError", "message": INPLACE})
    assert [f.cause for f in findings(path)] == ["backward-error"]


def test_a_script_error_after_the_model_ran(tmp_path: Path) -> None:
    path = crashed(tmp_path, end="error",
                   error={"type": "KeyError", "message": "'lr'", "file": "train.py", "line": 30})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == (
        "script-error", "error", "net", "", 2)
    assert f.message == "the script stopped at step 2 with KeyError (train.py:30): 'lr'"


def test_a_script_error_before_any_model_ran(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [], end="error",
                     error={"type": "ValueError", "message": "bad", "file": "t.py", "line": 3})
    assert summary(path) == [("script-error", "error", "", None)]
    assert findings(path)[0].model == ""


def test_nothing_requires_grad_says_which_model_is_frozen(tmp_path: Path) -> None:
    frozen = [("", "Net", 0), ("fc1", "Linear", 40, 0), ("act", "ReLU", 0),
              ("fc2", "Linear", 18, 0)]
    path = write_log(tmp_path / "log.jsonl", [], modules=frozen, end="error", error={
        "type": "RuntimeError",
        "message": "element 0 of tensors does not require grad and does not have a grad_fn"},
        end_steps=1)
    (f,) = findings(path)
    assert f.cause == "script-error"
    assert "every parameter of model 'net' is frozen (requires_grad=False)" in f.message
    assert f.hint.startswith("nothing the loss is computed from requires a gradient")


@pytest.mark.parametrize(("end", "kw", "how"), [
    (None, {}, "its log has no end record, so the process was killed"),
    ("interrupted", {"exit_code": -15}, "it was interrupted by SIGTERM"),
    ("interrupted", {"exit_code": 130, "error": {"type": "KeyboardInterrupt", "message": ""}},
     "it was interrupted by Ctrl-C (SIGINT)"),
])
def test_a_run_that_stopped_without_an_error(tmp_path: Path, end: str | None,
                                             kw: dict[str, Any], how: str) -> None:
    path = crashed(tmp_path, end=end, **kw)
    (f,) = findings(path)
    assert (f.cause, f.severity, f.model, f.module, f.step) == ("stopped", "error", "net", "", 2)
    assert f.message == f"the run did not finish: {how}" + (
        " (kill -9, out of memory, a job's time limit) or is still running" if end is None
        else "") + "; the last step it completed is 1"
    assert f.evidence["last_step"] == 1


def test_killed_before_any_model_ran(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [], end=None)
    (f,) = findings(path)
    assert (f.cause, f.model, f.step) == ("stopped", "", None)
    assert f.message.endswith(", before any model ran")


def test_killed_in_a_watched_step_may_have_gone_further(tmp_path: Path) -> None:
    path = crashed(tmp_path, end=None, head=header(steps="0:2"))
    (f,) = findings(path)
    assert f.message.endswith(
        "the last step it completed is 1 or later (steps after 1 were not recorded in full: "
        "--steps)")


@pytest.mark.parametrize(("error", "code"), [
    ({"type": "SystemExit", "message": "0"}, 0),
    ({"type": "SystemExit", "message": "3"}, 3),
])
def test_sys_exit_is_the_scripts_own_status_not_a_crash(tmp_path: Path, error: dict[str, str],
                                                        code: int) -> None:
    path = crashed(tmp_path, end="error", error=error, exit_code=code)
    assert findings(path) == []


def test_an_ok_run_is_silent(tmp_path: Path) -> None:
    assert findings(crashed(tmp_path)) == []


@pytest.mark.parametrize(("message", "want"), [
    ("plain", "plain"),
    ("two\n  lines\n\n", "two lines"),
    ("\x1b[31mred\x1b[0m text", "red text"),
    ("bad shape. Hint: try this instead", "bad shape"),
])
def test_message_text_is_one_clean_line(message: str, want: str) -> None:
    assert message_text(message) == want


def test_a_long_message_keeps_its_start_and_its_last_line() -> None:
    words = " ".join(f"word{i}" for i in range(200))
    text = message_text(words + "\nthe cause is here", limit=120)
    assert text.startswith("word0 word1")
    assert text.endswith(" ... the cause is here")
    assert len(text) <= 120
    head = text.split(" ... ")[0].split()
    assert head == [f"word{i}" for i in range(len(head))]  # whole words, none cut

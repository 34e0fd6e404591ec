"""The project's errors (``hooktrace.log.errors``) and wording (``hooktrace.log.words``): every way
a log cannot be read is one ``LogError`` line naming the log, with exit status 2; a colour-coded
message made plain; counts with their plural."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from hooktrace.log import schema
from hooktrace.log.errors import (
    HooktraceError,
    LogError,
    LogWriteError,
    NonFiniteError,
    plain,
)
from hooktrace.log.reader import MAX_LINE_BYTES, LogReader
from hooktrace.log.words import plural
from hooktrace.log.writer import LogWriter

HEADER = orjson.dumps(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0").to_dict())
MODEL = b'{"type":"model","model":0,"name":"m","class":"M"}'
END = b'{"type":"end","status":"ok"}'


def log_of(*lines: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "log.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        return path
    return make


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "future schema": (log_of(b'{"type":"header","schema":4,"hooktrace":"9"}'),
                      "newer than this hooktrace reads"),
    "older schema": (log_of(b'{"type":"header","schema":2,"hooktrace":"0.2"}'),
                     "written by an older hooktrace"),
    "first line not JSON": (log_of(b"{not json"), "is not a hooktrace log"),
    "first line no header": (log_of(MODEL), "is not a hooktrace log"),
    "line not JSON": (log_of(HEADER, b"{not json", END), "line 2 is not valid JSON"),
    "line of a wrong type": (log_of(HEADER, b'{"type":"model","model":"0","name":"m"}', END),
                             "line 2: key 'model' has the wrong type (str)"),
    "huge line": (lambda folder: log_of(HEADER, b'{"type":"model","name":"'
                                        + b"a" * MAX_LINE_BYTES + b'"}', END)(folder),
                  "line 2 is longer than 16 MB"),
    "empty": (log_of(b""), "is empty"),
    "missing": (lambda folder: folder / "nope.jsonl", "no such log"),
    "directory": (lambda folder: folder, "is a directory"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_log_error_is_one_line_naming_the_log(tmp_path: Path, case: str) -> None:
    make, message = CASES[case]
    path = make(tmp_path)
    with pytest.raises(LogError) as info:
        list(LogReader(path))
    text = str(info.value)
    assert message in text
    assert text.startswith(str(path)) or f" {path}" in text
    assert "\n" not in text and len(text) < 300
    assert info.value.exit_code == 2


def test_a_cut_off_last_line_is_no_error(tmp_path: Path) -> None:
    """The look-alike of "line not JSON": the same line, last, is a warning."""
    path = log_of(HEADER, MODEL)(tmp_path)
    path.write_bytes(path.read_bytes() + b"{not json")
    reader = LogReader(path)
    assert [r.TYPE for r in reader] == ["model"]
    assert "partial line 3" in reader.warnings[0]


def test_a_log_that_cannot_be_read_is_a_log_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = log_of(HEADER, END)(tmp_path)
    assert list(LogReader(path)) == [schema.End(status="ok")]
    # as a file without read permission looks (the tests may run as root, who reads any file)
    monkeypatch.setattr(os, "access", lambda p, mode: mode != os.R_OK)
    with pytest.raises(LogError) as info:
        LogReader(path)
    assert str(info.value) == f"cannot read {path}: permission denied"


def test_error_types() -> None:
    assert issubclass(LogError, HooktraceError) and issubclass(LogWriteError, LogError)
    assert LogWriteError("x").exit_code == LogError("x").exit_code == 2
    assert issubclass(NonFiniteError, RuntimeError)
    assert not issubclass(NonFiniteError, HooktraceError)  # raised into the user's program


def test_writer_errors_are_log_errors(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me\n")
    with pytest.raises(LogError) as info:
        LogWriter(tmp_path / "precious.txt")
    assert "\n" not in str(info.value)
    assert (tmp_path / "precious.txt").read_text() == "keep me\n"


@pytest.mark.parametrize(("message", "shown"), [
    ("\x1b[31mCUDA error\x1b[0m: out of memory", "CUDA error: out of memory"),
    ("\x1b[1;33mwarn\x1b[m", "warn"),
    ("\x1b[?25lhidden cursor", "hidden cursor"),
    ("no colour [31m here", "no colour [31m here"),  # a bracket without ESC is text
])
def test_plain_drops_terminal_colour(message: str, shown: str) -> None:
    assert plain(message) == shown


def test_plain_returns_a_message_without_escapes_as_is() -> None:
    message = "shape mismatch: [2, 3] vs [3, 2]"
    assert plain(message) is message


@pytest.mark.parametrize(("n", "text"), [(0, "0 steps"), (1, "1 step"), (2, "2 steps"),
                                         (-1, "-1 steps")])
def test_plural(n: int, text: str) -> None:
    assert plural(n, "step") == text

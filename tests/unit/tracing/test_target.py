"""What ``hooktrace run`` runs, checked before torch is imported (``tracing/target.py``): each
bad target is one error naming it, nothing is run; and the line about hooktrace's own options
given after the script."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hooktrace.log.errors import HooktraceError
from hooktrace.tracing.target import Target, check_target, misplaced, set_path


@pytest.mark.parametrize(("target", "message"), [
    (Target("nope.py", []), "no such script: nope.py"),
    (Target("folder", []), "folder is a directory with no __main__.py"),
    (Target("train.py", []), "the log would overwrite the script train.py; choose another -o"),
    (Target("no_such_module_here", [], True), "no module named no_such_module_here"),
])
def test_a_bad_target_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   target: Target, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "train.py").write_text("print('precious')\n")
    with pytest.raises(HooktraceError) as raised:
        check_target(target, Path("train.py"))
    assert str(raised.value) == message
    assert (tmp_path / "train.py").read_text() == "print('precious')\n"


def test_a_good_target_passes_and_sets_the_path_as_python_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["first", *sys.path])
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("")
    (tmp_path / "train.py").write_text("")
    check_target(Target("pkg", []), Path("log.jsonl"))  # a folder with __main__.py
    check_target(Target("train.py", []), Path("log.jsonl"))
    set_path(Target("train.py", []))
    assert Path(sys.path[0]).resolve() == tmp_path.resolve()
    check_target(Target("json", [], True), Path("log.jsonl"))  # found where python -m looks
    set_path(Target("json", [], True))
    assert Path(sys.path[0]).resolve() == tmp_path.resolve()


def test_the_line_names_the_options_the_script_got() -> None:
    own = {"-o", "--steps"}
    line = misplaced(Target("t.py", ["-o", "x.jsonl", "--steps=0:3", "--lr", "1"]), own)
    assert line == ("-o, --steps came after t.py, so the script got them, not hooktrace; "
                    "hooktrace's own options go before the script: hooktrace run -o --steps "
                    "... t.py")
    assert misplaced(Target("t.py", ["--lr", "1"]), own) is None
    assert misplaced(Target("t.py", ["--steps", "3"]), own, "bad value 42") is None

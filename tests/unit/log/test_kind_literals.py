"""The log's kinds spelled once: each kind of ``signal`` and ``anomaly`` record is a constant in
its home (``SignalKind`` in ``log/signals.py``, ``AnomalyKind`` in ``log/schema.py``), which every
writer and reader names; no string literal equal to one appears anywhere else in the package
(an AST walk; docstrings say the words in prose and are not walked). ``check``'s finding kinds
that share such a word, or that several of its modules name, are check's own, spelled once in
``check/findings.py`` (``FindingKind``), and held the same way. A planted literal is found."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import hooktrace
from hooktrace.check.findings import FindingKind
from hooktrace.log import schema
from hooktrace.log.signals import Signal, SignalKind, kinds_of

PACKAGE = Path(hooktrace.__file__).resolve().parent
KINDS = set(Signal.KINDS) | set(schema.Anomaly.KINDS) | set(kinds_of(FindingKind))
# file (relative to the package) -> the kind words it may spell: the homes
HOMES = {
    "log/signals.py": set(Signal.KINDS),
    "log/schema.py": set(schema.Anomaly.KINDS),
    "check/findings.py": set(kinds_of(FindingKind)),
}
# the same word for another idea, where it is that idea's own word
OTHER_IDEAS = {
    ("log/options.py", "probe"),  # the header's ``probe`` option (``run --probe``)
    ("show/view/heatmap.py", "no-grad"),  # a heatmap cell's mark
}


def _docstrings(tree: ast.Module) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, owners) and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def kind_literals(package: Path) -> list[str]:
    """``file:line: 'kind'`` for each string literal equal to a kind outside its home."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        for n in ast.walk(tree):
            if (isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in KINDS
                    and id(n) not in docstrings and n.value not in HOMES.get(where, ())
                    and (where, n.value) not in OTHER_IDEAS):
                found.append(f"{where}:{n.lineno}: {n.value!r}")
    return found


def test_no_kind_literal_outside_its_home() -> None:
    assert kind_literals(PACKAGE) == []


def test_a_planted_literal_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "hooktrace"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    loop, report = copy / "check" / "loop.py", copy / "check" / "report.py"
    watch = copy / "observe" / "watch.py"
    with loop.open("a", encoding="utf-8") as f:
        f.write('\n\ndef _planted(kind: str) -> bool:\n    """Says "eval-backward" in prose."""\n'
                '    return kind == "eval-backward"\n')
    with watch.open("a", encoding="utf-8") as f:
        f.write('\nPLANTED = ("no-grad", "probe")\n')
    with report.open("a", encoding="utf-8") as f:  # a finding kind, outside check/findings.py
        f.write('\nPLANTED = "zero-gradient"\n')
    assert kind_literals(copy) == [f"check/loop.py:{_lines(loop)}: 'eval-backward'",
                                   f"check/report.py:{_lines(report)}: 'zero-gradient'",
                                   f"observe/watch.py:{_lines(watch)}: 'no-grad'",
                                   f"observe/watch.py:{_lines(watch)}: 'probe'"]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_each_home_derives_its_kinds_from_its_constants() -> None:
    assert kinds_of(SignalKind) == Signal.KINDS
    assert kinds_of(schema.AnomalyKind) == schema.Anomaly.KINDS
    assert kinds_of(schema.EndStatus) == schema.END_STATUSES == ("ok", "error", "interrupted")
    assert kinds_of(schema.DropUnit) == schema.Module.DROP_UNITS == (
        "batch", "sample", "channel", "element")

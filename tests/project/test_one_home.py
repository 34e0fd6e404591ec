"""One home per idea (issue 37), kept: no import cycle, counting every import (under
``TYPE_CHECKING`` and inside functions too); no public name defined in two modules; no option of a
log's header read by its key outside ``hooktrace/log/``; the root's name ``(root)`` spelled once;
each kind of ``signal`` and ``anomaly`` record, and each finding kind ``check`` shares with one or
names in several modules, spelled only in its home (``SignalKind``, ``AnomalyKind``,
``FindingKind``); every package ``__init__`` only re-exports, in under 30 lines. Each rule is also
run on a copy of the package with one breach planted, so that it is seen to bite. Docstrings say
the words in prose and are not read."""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest

from hooktrace.check.findings import FindingKind
from hooktrace.log import schema
from hooktrace.log.signals import Signal, kinds_of

PACKAGE = Path(__file__).resolve().parents[2] / "hooktrace"


def _files(package: Path) -> dict[str, ast.Module]:
    """Each module of ``package`` by its path in it (``check/loop.py``), parsed."""
    return {path.relative_to(package).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(package.rglob("*.py"))}


def _modules(package: Path) -> dict[str, ast.Module]:
    """Each module of ``package`` by its dotted name (a package by its own name), parsed."""
    return {".".join((package.name, *Path(file).with_suffix("").parts)).removesuffix(".__init__"):
            tree for file, tree in _files(package).items()}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstrings' constants in ``tree``."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, owners) and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def _strings(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of ``tree`` that are not docstrings."""
    docstrings = _docstrings(tree)
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docstrings]


def _imported(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules ``module`` imports anywhere in its text: ``from a import b`` names
    ``a.b`` where that is a module, else ``a``."""
    package = module if f"{module}.__init__" in known else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out & known - {module}


def import_cycles(package: Path) -> list[list[str]]:
    trees = _modules(package)
    known = set(trees) | {f"{m}.__init__" for m, t in trees.items()
                          if (package.parent / m.replace(".", "/") / "__init__.py").exists()}
    graph = nx.DiGraph()
    for module, tree in trees.items():
        graph.add_edges_from((module, other) for other in _imported(module, tree, known))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def _defined(tree: ast.Module) -> set[str]:
    """The public names a module defines at its top level: functions, classes, and names bound
    to something other than a literal (type aliases, aliases of another name). A module's own
    tuning constant (``SAMPLE = 64``, ``FORMATS = ("csv", "jsonl")``) is its own."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None \
                and not _literal(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in out if not n.startswith("_")}


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def defined_twice(package: Path) -> dict[str, list[str]]:
    where = defaultdict(list)
    for module, tree in _modules(package).items():
        if not module.endswith("__main__"):
            for name in _defined(tree):
                where[name].append(module)
    return {name: modules for name, modules in sorted(where.items()) if len(modules) > 1}


def header_options_read(package: Path) -> list[str]:
    """Where a header's ``options`` is read by key (``x.options["steps"]``,
    ``x.options.get("steps")``) outside ``log/``."""
    def is_options(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "options"
    out = []
    for module, tree in _modules(package).items():
        if module.startswith(f"{package.name}.log"):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and is_options(node.value)) or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get" and is_options(node.func.value)):
                out.append(f"{module}:{node.lineno}")
    return out


def root_spelled(package: Path) -> list[str]:
    """Each place the text ``(root)`` is written in a string of the package."""
    return [f"{module}:{node.lineno}" for module, tree in _modules(package).items()
            for node in _strings(tree) if "(root)" in node.value]


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


def kind_literals(package: Path) -> list[str]:
    """``file:line: 'kind'`` for each string literal equal to a kind outside its home."""
    return [f"{file}:{n.lineno}: {n.value!r}" for file, tree in _files(package).items()
            for n in _strings(tree)
            if n.value in KINDS and n.value not in HOMES.get(file, ())
            and (file, n.value) not in OTHER_IDEAS]


def inits_with_logic(package: Path) -> list[str]:
    """Each package ``__init__`` of 30 lines or more, or one that defines a function or class
    (a module's own ``__getattr__``, which loads the tracing side lazily, is a re-export)."""
    out = []
    for path in sorted(package.rglob("__init__.py")):
        text = path.read_text(encoding="utf-8")
        defines = any(isinstance(n, ast.FunctionDef | ast.ClassDef) and not n.name.startswith("__")
                      for n in ast.parse(text).body)
        if text.count("\n") >= 30 or defines:
            out.append(str(path.relative_to(package.parent)))
    return out


RULES = {
    "import_cycles": import_cycles, "defined_twice": defined_twice,
    "header_options_read": header_options_read, "inits_with_logic": inits_with_logic,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_rule_holds(rule: str) -> None:
    assert not RULES[rule](PACKAGE)


def test_no_kind_literal_outside_its_home() -> None:
    assert kind_literals(PACKAGE) == []


def test_the_root_is_spelled_once() -> None:
    assert [where.split(":")[0] for where in root_spelled(PACKAGE)] == ["hooktrace.log.words"]


BREACHES = [
    # a check module that imports the collector, which imports it back
    ("import_cycles", "check/keys.py", "def _late():\n    from hooktrace.check import collect\n"),
    ("defined_twice", "show/marks.py", "def plural():\n    pass\n"),
    # an alias is a second definition too
    ("defined_twice", "observe/ops.py",
     "from hooktrace.log import gradstat\nGradStat = gradstat.GradStat\n"),
    ("header_options_read", "check/reached.py", "def _steps(h):\n    return h.options['steps']\n"),
    ("header_options_read", "show/marks.py", "def _ops(h):\n    return h.options.get('ops')\n"),
    ("inits_with_logic", "diff/__init__.py", "def helper():\n    pass\n"),
]


@pytest.mark.parametrize(("rule", "module", "text"), BREACHES)
def test_a_planted_breach_is_found(tmp_path: Path, rule: str, module: str, text: str) -> None:
    copy = tmp_path / "hooktrace"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / module).open("a", encoding="utf-8") as f:
        f.write(f"\n\n{text}")
    assert RULES[rule](copy)


def test_a_second_root_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "hooktrace"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "show" / "marks.py").open("a", encoding="utf-8") as f:
        f.write('\n\nLABEL = "(root)"\n')
    assert len(root_spelled(copy)) == 2


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

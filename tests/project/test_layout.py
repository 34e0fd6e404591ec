"""The layout's rules (docs/architecture.md): the import contracts hold and bite, the reading
side runs without torch, the top level holds the CLI and the subpackages, and no module is long."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hooktrace"
READERS = ("log", "check", "show", "diff")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _modules(package: str) -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                  for p in (PACKAGE / package).rglob("*.py"))


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(root), "PATH": ""})


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("show/marks.py", "import torch", "Readers never import torch"),
    ("log/words.py", "from hooktrace.check import findings", "Reading side"),
    ("check/findings.py", "from hooktrace.hooks import naming", "Readers never import the tracing"),
    ("hooks/sites.py", "from hooktrace.observe import stats", "Tracing side"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                              contract: str) -> None:
    """The same contracts on a copy of the package with one forbidden import added."""
    shutil.copytree(PACKAGE, tmp_path / "hooktrace")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "hooktrace" / module).open("a") as f:
        f.write(f"\n{line}  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    broken = [ln for ln in result.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(ln.startswith(contract) for ln in broken), result.stdout


def test_the_reading_side_imports_without_torch() -> None:
    """Every module of log/, check/, show/, diff/ and the CLI, imported in a fresh process,
    loads neither torch nor numpy."""
    modules = [m for package in READERS for m in _modules(package)] + ["hooktrace.cli"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert len(modules) > 40  # every subpackage was found


def test_the_top_level_holds_the_cli_and_the_subpackages() -> None:
    top = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert top == ["__init__.py", "__main__.py", "check", "cli.py", "diff", "hooks", "log",
                   "observe", "show", "tracing"]


def test_every_module_is_short_and_says_its_job() -> None:
    long, silent = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 400:
            long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        if not text.startswith('"""'):
            silent.append(str(path.relative_to(ROOT)))
    assert long == []
    assert silent == []

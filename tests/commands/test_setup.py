"""The setup scripts of a checkout, run for real in a copy of it: ``.ci/setup`` (the quick
start) needs no browser and no root where ``dot`` is there, installs nothing when everything is
there already, and where ``dot`` is missing and apt cannot be used says in one line what to
install with apt, dnf, brew or conda."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from venvs import SITE, clean_env, copy_checkout, pip, venv

#: what the setup scripts run besides Python and dot, found where this machine has them
TOOLS = ("bash", "dirname", "id")


def tools(folder: Path, *more: str) -> Path:
    """A folder of links to TOOLS and ``more``: the only programs a setup run below can find
    (no apt-get, no sudo, no chromium)."""
    folder.mkdir()
    for name in (*TOOLS, *more):
        found = shutil.which(name)
        assert found, f"{name} is not installed"
        (folder / name).symlink_to(found)
    return folder


def setup(repo: Path, path: Path, script: str = ".ci/setup") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(path / "bash"), script], cwd=repo, capture_output=True, text=True,
                          timeout=300, env=clean_env(PATH=str(path), PYTHON=sys.executable))


def test_without_dot_or_apt_one_line_names_the_package(tmp_path: Path) -> None:
    repo = copy_checkout(tmp_path / "repo", ".ci")
    result = setup(repo, tools(tmp_path / "bin"))
    assert result.returncode != 0
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for manager in ("apt install graphviz", "dnf install graphviz", "brew install graphviz",
                    "conda install -c conda-forge graphviz"):
        assert manager in result.stderr
    assert not (repo / ".venv").exists()  # it stops before anything is made


@pytest.fixture(scope="module")
def set_up(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the checkout whose .venv holds hooktrace, installed editable from it, and sees
    torch (and the build backend) without installing them: the checkout and its python."""
    repo = copy_checkout(tmp_path_factory.mktemp("setup") / "repo", ".ci")
    python = venv(repo / ".venv", SITE)
    installed = pip(python, "install", "--no-deps", "--no-build-isolation", "-e", repo)
    assert installed.returncode == 0, installed.stderr
    return repo, python


def test_set_up_already_it_installs_nothing_and_needs_no_browser(
        set_up: tuple[Path, Path], tmp_path: Path) -> None:
    """setup runs no pip (the install's files stay as they are), needs neither chromium nor
    apt nor root, and prints nothing."""
    repo, _ = set_up
    metadata = next((repo / ".venv").glob("lib/python*/site-packages/hooktrace-*.dist-info"))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in metadata.iterdir())
    result = setup(repo, tools(tmp_path / "bin", "dot"))
    assert (result.returncode, result.stderr) == (0, "")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in metadata.iterdir()) == before
    # what it checked is true: the quick start's command runs there
    run = subprocess.run([str(repo / ".venv" / "bin" / "hooktrace"), "--version"],
                         capture_output=True, text=True, env=clean_env())
    assert run.returncode == 0 and "hooktrace" in run.stdout, run.stderr


def test_after_pyproject_changes_it_installs_again(set_up: tuple[Path, Path]) -> None:
    """The check behind 'nothing to install' sees a pyproject.toml newer than the install."""
    repo, python = set_up
    pyproject = repo / "pyproject.toml"
    check = [str(python), str(repo / ".ci" / "installed.py"), "torch"]
    assert subprocess.run(check, env=clean_env()).returncode == 0
    was = pyproject.stat()
    pyproject.touch()
    try:
        again = subprocess.run(check, capture_output=True, text=True, env=clean_env())
    finally:
        os.utime(pyproject, ns=(was.st_atime_ns, was.st_mtime_ns))
    assert again.returncode == 1
    assert again.stderr == "setup: pyproject.toml changed since hooktrace was installed\n"

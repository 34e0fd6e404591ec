"""hooktrace installed as a user installs it: an sdist and a wheel built from the checkout, the
wheel installed with pip into fresh environments outside the repository, offline. Where torch
is there already, pip adds no torch (not even for ``hooktrace[torch]``) and ``hooktrace run``
traces a script of the user's own folder; where it is not, ``run`` says so in one line (exit 2)
and every reader works."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, SAMPLES
from venvs import SITE, clean_env, copy_checkout, dependencies_only, pip, venv

from hooktrace import __version__
from hooktrace.log.reader import LogReader

LOGS = ROOT / "tests" / "unit" / "logs"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, built by the build backend's own hook (``python -m build`` may not be
    installed), and the wheel built from the sdist, as ``python -m build`` does."""
    tmp = tmp_path_factory.mktemp("build")
    source, dist = copy_checkout(tmp / "source"), tmp / "dist"
    made = subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; "
                           "print(b.build_sdist(sys.argv[1]))", str(dist)], cwd=source,
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert made.returncode == 0, made.stderr
    sdist = dist / made.stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    unpacked = tmp / "unpacked" / f"hooktrace-{__version__}"
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "--no-index", "-w", str(dist),
                            str(unpacked)], capture_output=True, text=True, timeout=300,
                           env=clean_env())
    assert wheel.returncode == 0, wheel.stderr
    return sdist, next(dist.glob("hooktrace-*.whl"))


def user_folder(tmp: Path) -> Path:
    """A folder of the user's, outside the repository, with a training script of theirs."""
    folder = tmp / "project"
    folder.mkdir()
    shutil.copy(SAMPLES / "mnist_net.py", folder / "train.py")
    return folder


def test_the_sdist_and_the_wheel_hold_the_package_and_require_no_torch(
        built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "hooktrace/cli.py", "hooktrace/log/schema.py"} <= names
    with zipfile.ZipFile(wheel) as archive:
        tops = {n.split("/")[0] for n in archive.namelist()}
        meta = archive.read(f"hooktrace-{__version__}.dist-info/METADATA").decode()
    assert tops == {"hooktrace", f"hooktrace-{__version__}.dist-info"}
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    always = [line for line in requires if "extra ==" not in line]
    assert always and not [line for line in always if "torch" in line], always


def test_into_an_environment_with_torch_run_traces_the_users_script(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    """The user's environment has torch (any build); hooktrace[torch] installs without an index:
    the torch there satisfies it, nothing is downloaded."""
    python = venv(tmp_path / "env", SITE)
    installed = pip(python, "install", f"{built[1]}[torch]")
    assert installed.returncode == 0, installed.stderr
    folder = user_folder(tmp_path)
    where = subprocess.run([str(python), "-c", "import hooktrace; print(hooktrace.__file__)"],
                           cwd=folder, capture_output=True, text=True, env=clean_env())
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "env"), where
    run = subprocess.run([str(tmp_path / "env" / "bin" / "hooktrace"), "run", "train.py"],
                         cwd=folder, capture_output=True, text=True, timeout=300,
                         env=clean_env())
    assert run.returncode == 0, run.stderr
    assert "-> hooktrace.jsonl" in run.stderr
    header = LogReader(folder / "hooktrace.jsonl").header
    assert header.hooktrace == __version__ and header.argv == ["train.py"]


@pytest.fixture(scope="module")
def no_torch(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment with hooktrace and its dependencies, without torch: its bin folder."""
    tmp = tmp_path_factory.mktemp("notorch")
    python = venv(tmp / "env", dependencies_only(tmp / "dependencies"))
    installed = pip(python, "install", built[1])
    assert installed.returncode == 0, installed.stderr
    torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True,
                           env=clean_env())
    assert torch.returncode == 1  # the environment is what it claims to be
    return python.parent


def test_without_torch_run_says_what_to_install(no_torch: Path, tmp_path: Path) -> None:
    run = subprocess.run([str(no_torch / "hooktrace"), "run", "train.py"],
                         cwd=user_folder(tmp_path), capture_output=True, text=True,
                         timeout=300, env=clean_env())
    assert run.returncode == 2
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith("hooktrace: error: run needs PyTorch") and "pip install" in \
        run.stderr


@pytest.mark.parametrize(("command", "status", "written"), [
    (["check", "mnist.jsonl"], 0, None),
    (["show", "mnist.jsonl"], 0, None),
    (["render", "mnist.jsonl"], 0, "mnist.svg"),
    (["view", "mnist.jsonl"], 0, "mnist.html"),
    (["export", "mnist.jsonl"], 0, "mnist.csv"),
    (["diff", "mnist.jsonl", "mnist.jsonl"], 0, None),
])
def test_without_torch_the_readers_work(no_torch: Path, tmp_path: Path, command: list[str],
                                        status: int, written: str | None) -> None:
    shutil.copy(LOGS / "mnist.jsonl", tmp_path)
    result = subprocess.run([str(no_torch / "hooktrace"), *command], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=clean_env())
    assert result.returncode == status, result.stderr
    assert written is None or (tmp_path / written).stat().st_size > 0

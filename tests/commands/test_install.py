"""hooktrace installed as a user installs it: an sdist and a wheel built from the checkout, the
wheel installed with pip into fresh environments outside the repository, offline. Where torch
is there already, pip adds no torch (not even for ``hooktrace[torch]``) and ``hooktrace run``
traces a script of the user's own folder; where it is not, ``run`` says so in one line (exit 2)
and every reader works."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
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


def readme_install() -> tuple[list[str], list[str]]:
    """The README's install line, and the wheel of its comment, as argv."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("**Into your own environment**", 1)[1].split("```sh\n", 1)[1]
    install, _, wheel = block.split("\n```", 1)[0].partition("# or a wheel:")
    return shlex.split(install), shlex.split(wheel)


def test_the_readmes_install_line_works_where_it_says(tmp_path: Path) -> None:
    """In the folder of a clone, where the README runs it, its line installs hooktrace (before:
    ``./hooktrace``, the package's own folder there, which pip cannot install), and its
    comment's wheel builds."""
    clone = copy_checkout(tmp_path / "hooktrace")
    install, wheel = readme_install()
    assert install[:4] == ["python", "-m", "pip", "install"] and "wheel" in wheel
    python = venv(tmp_path / "env", SITE)
    installed = pip(python, *install[3:], "--no-deps", "--no-build-isolation", cwd=clone)
    assert installed.returncode == 0, installed.stderr
    where = subprocess.run([str(python), "-c", "import hooktrace; print(hooktrace.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=clean_env())
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "env"), where
    built = subprocess.run([sys.executable, "-m", "pip", *wheel[wheel.index("wheel"):],
                            "--no-build-isolation", "--no-index", "-q"], cwd=clone,
                           capture_output=True, text=True, timeout=300, env=clean_env())
    assert built.returncode == 0, built.stderr
    assert len(list((clone / "dist").glob("hooktrace-*.whl"))) == 1


def installed_for(requirements: list[str], extra: str) -> set[str]:
    """The distributions pip installs for ``requirements`` (a METADATA's Requires-Dist) with
    ``extra``, as this interpreter has them: each one's own requirements that its markers and
    the extras asked of it select."""
    from packaging.requirements import Requirement

    names: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), {extra}) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": e}) for e in extras or {""}):
            continue
        key = (requirement.name.lower(), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(requirement.name)
        requires = metadata.distribution(requirement.name).requires or []
        todo += [(Requirement(r), set(requirement.extras)) for r in requires]
    return names


def test_torch_from_the_torch_extra_imports_without_a_warning(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    """What ``.[torch]`` installs (the quick start's setup) imports torch without "Failed to
    initialize NumPy": torch does not require numpy, and warns at import without it."""
    with zipfile.ZipFile(built[1]) as archive:
        meta = archive.read(f"hooktrace-{__version__}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    names = installed_for(requires, "torch")
    assert "torch" in names
    python = venv(tmp_path / "env", dependencies_only(tmp_path / "installed", names))
    imported = subprocess.run([str(python), "-c", "import torch; torch.ones(1).numpy()"],
                              capture_output=True, text=True, timeout=300, env=clean_env())
    assert (imported.returncode, imported.stderr) == (0, "")


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

"""Fresh virtual environments for the tests of installing hooktrace, made offline in a second:
``python -m venv --without-pip``, pip run from this interpreter (``pip --python``), and the
packages they may use (torch, the build backend, hooktrace's dependencies) seen through a
``.pth`` file instead of downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from helpers import ROOT

#: this interpreter's site-packages: torch, setuptools and every test dependency are there
SITE = Path(sysconfig.get_paths()["purelib"])
#: what installing and running hooktrace needs besides torch (pyproject.toml's dependencies)
DEPENDENCIES = ("click", "orjson", "networkx", "graphviz")
#: the files of the checkout a build of hooktrace reads
SOURCES = ("pyproject.toml", "README.md", "hooktrace")


def clean_env(**more: str) -> dict[str, str]:
    """This process's environment without what would let another Python find this checkout or
    these site-packages (PYTHONPATH, a virtualenv's variables)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("PYTEST_")}
    env.update(more)
    return env


def copy_checkout(dest: Path, *more: str) -> Path:
    """The sources of a build (and ``more``, paths of the checkout) copied to ``dest``: a build
    writes into its source tree (egg-info, build/), never into this checkout."""
    dest.mkdir(parents=True)
    for name in (*SOURCES, *more):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def venv(path: Path, *sees: Path) -> Path:
    """A new virtualenv at ``path`` whose Python also imports from the folders ``sees`` (after
    its own site-packages); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   env=clean_env())
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True, env=clean_env()).stdout.strip()
    if sees:
        Path(purelib, "seen.pth").write_text("".join(f"{p}\n" for p in sees))
    return python


def dependencies_only(dest: Path, names: Iterable[str] = DEPENDENCIES) -> Path:
    """A folder holding the distributions ``names`` (default: hooktrace's dependencies, and
    not torch): links into this interpreter's site-packages, their metadata included, so that
    pip finds them installed."""
    dest.mkdir(parents=True)
    for name in names:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "bin"}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (dest / top).exists():
                (dest / top).symlink_to(source)
    return dest


def pip(python: Path, *args: str | os.PathLike[str], cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``pip ARGS`` into the environment of ``python``, offline (``--no-index``)."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *map(str, args),
                           "--no-index", "--disable-pip-version-check", "-q"],
                          capture_output=True, text=True, timeout=300, env=clean_env(), cwd=cwd)

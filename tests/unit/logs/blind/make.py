"""Writes the blind sets' logs the unit tests read: each case of the bug scripts written blind
(``tests/scripts/blind_*.py``: bugs and their healthy look-alikes), traced by ``hooktrace run``
(blind set 5 also with ``--probe``), one archive per script, the header's machine facts made
constant; then what ``check`` names in each (``test_blind_names_unchanged.py``).

    python tests/unit/logs/blind/make.py                 # every script
    python tests/unit/logs/blind/make.py blind_bugs5     # one

These logs are not rewritten when the tracer changes: they are the readers' fixed input, so that
a change to ``check`` that alters what it says of a blind case shows as a diff of the reports.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
SCRIPTS = ROOT / "tests" / "scripts"
sys.path.insert(0, str(ROOT))

from tests.unit.logs.make import constant_header  # noqa: E402

#: script -> the options of each way its cases are traced, by the suffix of the log's name
BLIND: dict[str, dict[str, tuple[str, ...]]] = {
    "blind_bugs": {"": ()}, "blind_bugs3": {"": ()}, "blind_bugs4": {"": ()},
    "blind_bugs5": {"": (), ".probe": ("--probe",)}, "blind_model": {"": ()},
}


def cases(script: str) -> list[str]:
    code = f"import {script}; print('\\n'.join({script}.CASES))"
    out = subprocess.run([sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True,
                         text=True, check=True, timeout=300)
    return out.stdout.split()


def trace(script: str, case: str, options: tuple[str, ...], log: Path) -> bytes:
    subprocess.run([sys.executable, "-m", "hooktrace", "run", *options, "-o", str(log),
                    f"{script}.py", case], cwd=SCRIPTS, capture_output=True, check=False,
                   timeout=600)
    return constant_header(log.read_bytes())


def archive(script: str) -> Path:
    """The script's cases traced, in ``HERE/SCRIPT.tar.gz`` (members ``CASE[.probe].jsonl``)."""
    jobs = [(f"{case}{suffix}.jsonl", options) for case in cases(script)
            for suffix, options in BLIND[script].items()]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        logs = pool.map(lambda job: trace(script, job[0].split(".")[0], job[1],
                                          Path(tmp) / job[0]), jobs)
        path = HERE / f"{script}.tar.gz"
        with gzip.GzipFile(path, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for (member, _), raw in zip(jobs, logs, strict=True):
                info = tarfile.TarInfo(member)
                info.size, info.mtime = len(raw), 0
                tar.addfile(info, io.BytesIO(raw))
    print(f"{path.name}: {len(jobs)} logs, {path.stat().st_size} bytes")
    return path


if __name__ == "__main__":
    for script in sys.argv[1:] or list(BLIND):
        archive(script)
    from tests.unit.check import test_blind_names_unchanged
    test_blind_names_unchanged.write()

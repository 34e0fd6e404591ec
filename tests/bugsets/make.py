"""Writes a bug set's logs for the unit tier: every case of ``tests/bugsets/SET`` traced by
``hooktrace run`` (as ``zoo.py`` runs it), the header's machine facts made constant, in one
archive ``tests/unit/logs/bugsets/SET.tar.xz``; then the verdict ``check`` gives each case today
(``SET.verdicts.json``), which ``tests/unit/check/test_bugsets.py`` holds as the baseline.

    python tests/bugsets/make.py set6                       # trace set 6, 2 cases at a time
    python tests/bugsets/make.py set6 --logs $ZOO_OUT       # archive the logs of a zoo.py run
    python tests/bugsets/make.py set6 --verdicts            # only record today's verdicts

Like the blind sets' logs, these are not rewritten when the tracer changes: they are the
readers' fixed input. Rewrite them when a set gains a case, and review the verdicts' diff.
"""

from __future__ import annotations

import argparse
import io
import lzma
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import orjson  # noqa: E402
from bugsets.zoo import Case, manifest, trace  # noqa: E402

from tests.unit.logs.make import constant_header  # noqa: E402

ARCHIVES = ROOT / "tests" / "unit" / "logs" / "bugsets"


def traced(name: str, folder: Path, jobs: int) -> Path:
    """Every case of set ``name`` traced into ``folder``; the folder."""
    def one(case: Case) -> None:
        result = trace(name, case, folder)
        print(f"{case['id']}: exit {result['run_exit']}, {result['run_seconds']} s", flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, manifest(name)))
    return folder


def portable(raw: bytes) -> bytes:
    """The log with its header made constant and no path of this machine: a source record's
    absolute file (a library's module, e.g. torchvision's resnet.py) kept from site-packages/ on."""
    lines = constant_header(raw).split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b'{"type":"source"'):
            record = orjson.loads(line)
            file = record.get("file", "")
            if file.startswith("/"):
                _, sep, tail = file.rpartition("site-packages/")
                record["file"] = sep + tail if sep else Path(file).name
                lines[i] = orjson.dumps(record)
    return b"\n".join(lines)


def archive(name: str, logs: Path) -> Path:
    """The logs of set ``name`` found in ``logs``, in ``ARCHIVES/NAME.tar.xz`` (members
    ``ID.jsonl`` in the manifest's order, made portable, no time or owner)."""
    path = ARCHIVES / f"{name}.tar.xz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for case in manifest(name):
            raw = portable((logs / f"{case['id']}.jsonl").read_bytes())
            info = tarfile.TarInfo(f"{case['id']}.jsonl")
            info.size, info.mtime = len(raw), 0
            tar.addfile(info, io.BytesIO(raw))
    print(f"{path.name}: {len(manifest(name))} logs, {path.stat().st_size} bytes")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", nargs="+", help="set folders under tests/bugsets, e.g. set6")
    parser.add_argument("--logs", type=Path, help="take the logs of a zoo.py run (one set)")
    parser.add_argument("--verdicts", action="store_true",
                        help="keep the archive, only record today's verdicts")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    from unit.check import test_bugsets
    for name in args.sets:
        if args.verdicts:
            pass
        elif args.logs:
            archive(name, args.logs)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                archive(name, traced(name, Path(tmp), args.jobs))
        test_bugsets.write(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

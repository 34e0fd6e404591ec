"""Writes the logs the unit tests read: each a real ``hooktrace run`` of a bundled sample or a test
script, with the header's machine facts (pid, hostname, start time, versions) made constant so a
rewrite changes only what the tracer changed.

    python tests/unit/logs/make.py            # every log
    python tests/unit/logs/make.py gan vae    # some

Run it after a change to what the tracer writes; ``tests/commands/test_unit_logs.py`` fails while a
checked-in log no longer matches what the tracer writes today.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SAMPLES = ROOT / "samples"
SCRIPTS = ROOT / "tests" / "scripts"

#: name -> (folder the script runs in, script, hooktrace run options, script arguments)
LOGS: dict[str, tuple[Path, str, tuple[str, ...], tuple[str, ...]]] = {
    "mnist": (SAMPLES, "mnist_net.py", ("--time",), ()),
    "dead_relu": (SAMPLES, "dead_relu.py", (), ()),
    "detached": (SAMPLES, "detached_branch.py", (), ()),
    "exploding": (SAMPLES, "exploding.py", (), ()),
    "eval_mode": (SAMPLES, "forgot_train_mode.py", ("--time",), ()),
    "frozen": (SAMPLES, "frozen_by_mistake.py", (), ()),
    "gan": (SAMPLES, "gan.py", ("--time",), ()),
    "nan_layer": (SAMPLES, "nan_layer.py", ("--time",), ()),
    "stale_optimizer": (SAMPLES, "stale_optimizer.py", (), ()),
    "unused": (SAMPLES, "unused_module.py", (), ()),
    "vae": (SAMPLES, "vae.py", ("--time",), ()),
    "long_run": (SAMPLES, "long_run.py", ("--steps", "0:2"), ("--steps", "60", "--nan-step", "50")),
    "ops": (SAMPLES, "detached_branch.py", ("--ops", "branch_b*"), ()),
    "crash": (SCRIPTS, "raise_error.py", (), ()),
    "diff_a": (SCRIPTS, "diff_train.py", (), ()),
    "diff_lr": (SCRIPTS, "diff_train.py", (), ("--lr", "0.2")),
    "diff_extra": (SCRIPTS, "diff_train.py", (), ("--extra",)),
    "diff_nan": (SCRIPTS, "diff_train.py", (), ("--nan-step", "3")),
    "diff_rename": (SCRIPTS, "diff_train.py", (), ("--rename",)),
    "diff_swap": (SCRIPTS, "diff_train.py", (), ("--swap",)),
    "diff_twice": (SCRIPTS, "diff_train.py", (), ("--twice",)),
    "diff_nostats": (SCRIPTS, "diff_train.py", ("--no-stats", "--steps", "0:3"), ()),
}

#: the header's facts about the machine and the moment, made constant
CONSTANT = {"pid": 1, "hostname": "host", "started": 1700000000.0, "torch": "2.x",
            "python": "3.x"}


def trace(name: str, folder: Path) -> Path:
    """``hooktrace run`` of one entry of LOGS into ``folder``; the raw log's path."""
    cwd, script, options, args = LOGS[name]
    log = folder / f"{name}.jsonl"
    subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", str(log), *options, script,
                    *args], cwd=cwd, capture_output=True, check=False, timeout=600)
    return log


def constant_header(raw: bytes) -> bytes:
    """The log with CONSTANT in its header line."""
    first, _, rest = raw.partition(b"\n")
    header = orjson.loads(first)
    header.update({k: v for k, v in CONSTANT.items() if k in header})
    return orjson.dumps(header) + b"\n" + rest


def main(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        for name, raw in zip(names, pool.map(lambda n: trace(n, Path(tmp)), names), strict=True):
            (HERE / f"{name}.jsonl").write_bytes(constant_header(raw.read_bytes()))
            print(f"{name}: {raw.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:] or list(LOGS))

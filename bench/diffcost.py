"""The cost of ``hooktrace diff`` on two big logs, next to ``hooktrace check`` on one.

    .venv/bin/python -m bench.diffcost [--events 1000000] [--repeats 3]

The logs are made as ``logtools`` makes them (W2's steady-state step, repeated): A; B, a copy
of A (the runs agree: every step is compared and found equal); and C, whose gradient
statistics are all 1% larger (the runs differ in every call of every step: the slowest case).
Prints CPU seconds, wall seconds and peak memory of each command, median of the repeats, and
each diff's CPU time as a multiple of check's against the target (under ``TARGET`` x). Fails
when a command exits otherwise than expected (check 0 or 1, diff of the copy 0, of C 1).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench import logtools, workloads


def _scaled(template: logtools.Template, factor: float) -> logtools.Template:
    """The template with every gradient statistic multiplied by ``factor``."""
    step = copy.deepcopy(template.step)
    for record in step:
        for key in ("in_stats", "out_stats"):
            stats = record.get(key)
            if stats:
                record[key] = [None if s is None else [v * factor for v in s] for s in stats]
    return logtools.Template(template.head, step, template.events, template.first_seq)


TARGET = 2.0  # diff of two logs, in CPU time: under this many times check on one


def _commands(folder: Path) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    """Each command, with the exit statuses it may end with."""
    hooktrace = [sys.executable, "-m", "hooktrace"]
    a, b, c = (str(folder / f"{n}.jsonl") for n in "abc")
    return {"check A": ([*hooktrace, "check", a], (0, 1)),  # 1: it found problems
            "diff A B (agree)": ([*hooktrace, "diff", a, b], (0,)),
            "diff A C (differ)": ([*hooktrace, "diff", a, c], (1,))}


def measure(events: int, repeats: int, folder: Path) -> list[dict[str, Any]]:
    work = workloads.build("W2", torch.device("cpu"))
    template = logtools.make_template(work.model, work.step, folder)
    written = logtools.write_log(template, events, folder / "a.jsonl")
    shutil.copy(folder / "a.jsonl", folder / "b.jsonl")
    logtools.write_log(_scaled(template, 1.01), events, folder / "c.jsonl")
    runs: dict[str, list[logtools.ToolRun]] = {name: [] for name in _commands(folder)}
    for _ in range(repeats):  # interleaved: the same machine load for each command
        for name, (argv, ok) in _commands(folder).items():
            runs[name].append(logtools.run_child(argv, ok=ok))
    return [{"command": name, "events": written,
             "cpu_s": statistics.median(r.cpu for r in done),
             "wall_s": statistics.median(r.wall for r in done),
             "peak_mb": max(r.peak_mb for r in done)} for name, done in runs.items()]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.diffcost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events in each log (default 1000000; whole steps of W2, so a "
                             "few more)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each command, interleaved; the median is shown (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = measure(args.events, args.repeats, Path(folder))
    check = rows[0]["cpu_s"]
    print(f"| command | events per log | CPU s | x check (target < {TARGET:g}x) | wall s | "
          "peak MB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ratio = row["cpu_s"] / check
        verdict = "" if row is rows[0] else (" ok" if ratio < TARGET else " OVER")
        print(f"| {row['command']} | {row['events']:,} | {row['cpu_s']:.2f} | "
              f"{ratio:.2f}x{verdict} | {row['wall_s']:.2f} | {row['peak_mb']:.0f} |")


if __name__ == "__main__":
    main()

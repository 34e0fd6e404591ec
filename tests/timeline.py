"""Where a test run's wall time went: ``python tests/timeline.py FILE`` for a run made with
``HOOKTRACE_TEST_TIMELINE=FILE`` (``conftest.py``). Prints the wall time, how busy each test
process was, the slowest test files (summed), and what each process ran last."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    start = min(r[2] for r in rows)
    end = max(r[3] for r in rows)
    print(f"wall {end - start:.0f} s, {len(rows)} tests")
    by_worker: dict[str, list[list[object]]] = defaultdict(list)
    for row in rows:
        by_worker[row[0]].append(row)
    for worker, mine in sorted(by_worker.items()):
        busy = sum(r[3] - r[2] for r in mine)
        last = max(r[3] for r in mine)
        print(f"{worker}: {len(mine)} tests, busy {busy:.0f} s, done at {last - start:.0f} s")
        for r in sorted(mine, key=lambda r: r[3])[-3:]:
            print(f"    last: {r[1]} ({r[3] - r[2]:.1f} s, ended at {r[3] - start:.0f} s)")
    files: dict[str, float] = defaultdict(float)
    for r in rows:
        files[r[1].split("::")[0]] += r[3] - r[2]
    print("slowest files (seconds in tests, setup included):")
    for name, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {seconds:7.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])

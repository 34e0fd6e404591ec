"""What ``check``'s gradient-flow judgement costs per call as a step's calls grow: an unrolled
loop of 500 and 5,000 calls of the same modules (the judgement must stay linear in the calls).

    .venv/bin/python -m bench.flowscale [--repeats 5]

Prints the CPU time per call at each size and their ratio (target: under 4x; a scan over the
step per call, the old way, made it about 10x). Writes no results file.
"""

from __future__ import annotations

import argparse
import time

from hooktrace.check import flow
from hooktrace.check.calls import JudgedCall
from hooktrace.check.collected import ModuleStats
from hooktrace.check.findings import Thresholds

SIZES = (500, 5000)
TARGET = 4.0
MODULES = {(0, ""): ModuleStats(0, "", "Net"), (0, "rnn"): ModuleStats(0, "rnn", "RNN"),
           (0, "rnn.cell"): ModuleStats(0, "rnn.cell", "LSTMCell", 1, 1),
           (0, "rnn.head"): ModuleStats(0, "rnn.head", "Linear", 1, 1)}


def unrolled(time_steps: int, flat_at: int | None = None) -> list[JudgedCall]:
    """A model's root calling ``rnn.cell`` and ``rnn.head`` once per time step (inside one
    ``rnn`` call), backward run through every call; ``flat_at``: the head call of that time
    step gets 1e-12 of the others' gradient (something flat around it in ``rnn``'s forward)."""
    calls, seq = [], 0
    for t in range(time_steps):
        for name in ("rnn.cell", "rnn.head"):
            seq += 1
            calls.append(JudgedCall(0, seq, (0, name), t, True))
    for name in ("rnn", ""):
        seq += 1
        calls.append(JudgedCall(0, seq, (0, name), 0, True))
    for c in calls:
        g = 1e-12 if c.key[1] == "rnn.head" and c.call == flat_at else 1.0 - c.seq * 1e-6
        c.gradients([[g, g]], [[g * 0.5, g]])
    return calls


def per_call(time_steps: int, repeats: int) -> float:
    """The least CPU seconds per call of ``flow.analyse`` over ``repeats`` runs."""
    best = float("inf")
    for _ in range(repeats):
        calls = unrolled(time_steps)
        start = time.process_time()
        found = flow.analyse(calls, MODULES, Thresholds())
        best = min(best, (time.process_time() - start) / len(calls))
        assert found.boundaries == {}, "a healthy unrolled loop judged unhealthy"
    return best


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flowscale", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    small, big = (per_call(n, args.repeats) for n in SIZES)
    ratio = big / small
    print(f"| calls | CPU us per call |\n|---|---|\n| {SIZES[0]:,} | {small * 1e6:.2f} |\n"
          f"| {SIZES[1]:,} | {big * 1e6:.2f} |\n\nratio {ratio:.2f}x (target under {TARGET}x): "
          f"{'met' if ratio < TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()

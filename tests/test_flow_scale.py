"""``flow`` (where the gradient dies) stays linear in the calls of a step: an unrolled loop of
thousands of calls of the same modules is judged in about the time of its events, and a starved
call among them is still named."""

from __future__ import annotations

import time

from hooktrace.check import flow
from hooktrace.check.calls import Call
from hooktrace.check.collected import ModuleStats
from hooktrace.check.findings import Thresholds


def _unrolled(time_steps: int, flat_at: int | None = None) -> list[Call]:
    """A model's root calling ``rnn.cell`` and ``rnn.head`` once per time step (inside one
    ``rnn`` call), backward run through every call; ``flat_at``: the head call of that time
    step gets 1e-12 of the others' gradient (something flat around it in ``rnn``'s forward)."""
    calls, seq = [], 0
    for t in range(time_steps):
        for name in ("rnn.cell", "rnn.head"):
            seq += 1
            calls.append(Call(0, seq, (0, name), t, True))
    for name in ("rnn", ""):
        seq += 1
        calls.append(Call(0, seq, (0, name), 0, True))
    for c in calls:
        g = 1e-12 if c.key[1] == "rnn.head" and c.call == flat_at else 1.0 - c.seq * 1e-6
        c.gradients([[g, g]], [[g * 0.5, g]])
    return calls


MODULES = {(0, ""): ModuleStats(0, "", "Net"), (0, "rnn"): ModuleStats(0, "rnn", "RNN"),
           (0, "rnn.cell"): ModuleStats(0, "rnn.cell", "LSTMCell", 1, 1),
           (0, "rnn.head"): ModuleStats(0, "rnn.head", "Linear", 1, 1)}


def test_many_calls_of_a_step_cost_their_number() -> None:
    per_call = []
    for steps in (500, 5000):
        calls = _unrolled(steps)
        start = time.process_time()
        found = flow.analyse(calls, MODULES, Thresholds())
        per_call.append((time.process_time() - start) / len(calls))
        assert found.boundaries == {}
    # a scan over the step per call (the old way) made this 10x; allow for a noisy machine
    assert per_call[1] < 4 * per_call[0] + 2e-5


def test_a_flat_call_among_thousands_is_named() -> None:
    found = flow.analyse(_unrolled(3000, flat_at=1234), MODULES, Thresholds())
    [boundary] = found.boundaries.values()
    assert (boundary.key, boundary.cause, list(boundary.victims)) == (
        (0, "rnn"), "zeroed", [(0, "rnn.head")])
    assert list(boundary.branches) == ["rnn.head (call 1234)"]

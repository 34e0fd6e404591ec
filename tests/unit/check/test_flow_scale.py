"""``flow`` (where the gradient dies) on an unrolled loop of thousands of calls of the same
modules: a starved call among them is still named. What it costs per call as the calls grow is
measured by ``python -m bench.flowscale``, not here (timing on shared cores is not a test)."""

from __future__ import annotations

from bench.flowscale import MODULES, unrolled
from hooktrace.check import flow
from hooktrace.check.findings import Thresholds


def test_a_healthy_unrolled_loop_has_no_boundary() -> None:
    assert flow.analyse(unrolled(3000), MODULES, Thresholds()).boundaries == {}


def test_a_flat_call_among_thousands_is_named() -> None:
    found = flow.analyse(unrolled(3000, flat_at=1234), MODULES, Thresholds())
    [boundary] = found.boundaries.values()
    assert (boundary.key, boundary.cause, list(boundary.victims)) == (
        (0, "rnn"), "zeroed", [(0, "rnn.head")])
    assert list(boundary.branches) == ["rnn.head (call 1234)"]

"""The pieces ``diff`` is made of, on data built in the test: ``Tolerance`` (NaN agrees with NaN,
an infinity with itself), the relative difference, parameter-gradient norms side by side,
``Tolerance.compare`` on two matched calls (NaN/Inf in one run first, then the largest relative
difference), the growth profile's sampling, and the report's wording of steps and sections."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hooktrace.diff.compare import Difference, DiffReport, ParamDifference
from hooktrace.diff.numbers import (
    Found,
    Growth,
    Tolerance,
    most_differing,
    param_differences,
    relative,
)
from hooktrace.diff.report import diff_text
from hooktrace.log.align import Event
from hooktrace.log.words import ranges

DEFAULT = Tolerance(0.002, 0.0)
NAN, INF = math.nan, math.inf


def backward(name: str = "fc", out: Any = ((1.0, 0.5),), ins: Any = ((2.0, 1.0),)) -> Event:
    return Event("net", "backward", name, 0, [[4, 8]], [[4, 8]], (), (),
                 [list(s) if s else None for s in ins], [list(s) if s else None for s in out],
                 None)


def forward(name: str = "fc", nonfinite: Any = None) -> Event:
    return Event("net", "forward", name, 0, [[4, 8]], [[4, 8]], ["float32"], ["float32"], None,
                 None, nonfinite)


# -- Tolerance and relative ------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "y", "close"), [
    (1.0, 1.0, True), (1.0, 1.002, True), (1.0, 1.0021, False), (-1.0, -1.002, True),
    (0.0, 0.0, True), (0.0, 1e-30, False), (NAN, NAN, True), (INF, INF, True),
    (-INF, -INF, True), (INF, -INF, False), (NAN, 1.0, False), (1.0, INF, False),
    (NAN, INF, False),
])
def test_tolerance_close(x: float, y: float, close: bool) -> None:
    assert DEFAULT.close(x, y) == close
    assert DEFAULT.close(y, x) == close


def test_atol_is_added() -> None:
    assert not DEFAULT.close(0.0, 1e-9)
    assert Tolerance(0.002, 1e-8).close(0.0, 1e-9)
    assert Tolerance(0.0, 0.0).close(3.0, 3.0) and not Tolerance(0.0, 0.0).close(3.0, 3.0001)


@pytest.mark.parametrize(("x", "y", "expected"), [(1.0, 2.0, 0.5), (2.0, 1.0, 0.5),
                                                  (0.0, 0.0, 0.0), (-1.0, 1.0, 2.0)])
def test_relative(x: float, y: float, expected: float) -> None:
    assert relative(x, y) == expected


def test_param_differences() -> None:
    a = {"fc1": 1.0, "fc2": 2.0, "frozen": None, "gone": 1.0}
    b = {"fc1": 1.001, "fc2": 3.0, "frozen": None, "new": 4.0}
    assert param_differences(a, b, DEFAULT) == [
        ("fc2", 2.0, 3.0), ("gone", 1.0, None), ("new", None, 4.0)]  # A's order, then B's
    assert param_differences(a, a, DEFAULT) == []


# -- Tolerance.compare ----------------------------------------------------------------------------

def test_equal_calls_agree() -> None:
    numbers = DEFAULT
    assert numbers.compare(backward(), backward()) is None
    assert numbers.compare(forward(), forward()) is None
    assert numbers.compare(backward(out=[(1.0, 0.5)]), backward(out=[(1.001, 0.5)])) is None


def test_the_largest_relative_difference_is_named() -> None:
    found = DEFAULT.compare(backward(out=[(1.0, 0.5)], ins=[(2.0, 1.0)]),
                           backward(out=[(1.1, 0.5)], ins=[(2.0, 2.0)]))
    assert found is not None
    assert (found.kind, found.label, found.stat, found.relative) == ("value", "grad_input 0",
                                                                     "absmax", 0.5)
    assert found.words() == ("grad_input 0 absmax differs by 0.5 (relative)", "1", "2")


def test_nonfinite_in_one_run_outranks_any_value() -> None:
    found = DEFAULT.compare(backward(out=[(1.0, 0.5)], ins=[(1.0, 0.5)]),
                           backward(out=[(9.0, 0.5)], ins=[(NAN, NAN, 3, 0)]))
    assert found is not None
    assert (found.kind, found.label, found.relative) == ("nonfinite", "grad_input 0", None)
    assert found.words() == ("grad_input 0 has NaN/Inf in B only", "norm 1, absmax 0.5",
                             "3 NaN, 0 Inf")


def test_nonfinite_in_both_runs_is_no_difference() -> None:
    numbers = DEFAULT
    assert numbers.compare(backward(out=[(NAN, NAN, 3, 0)]), backward(out=[(NAN, NAN, 5, 1)])) \
        is None


def test_a_gradient_in_one_run_only_is_left_to_shapes() -> None:
    assert DEFAULT.compare(backward(ins=[None]), backward(ins=[(2.0, 1.0)])) is None


@pytest.mark.parametrize(("a", "b", "label"), [
    ([[0, 3, 0]], None, "output 0"), (None, [[1, 0, 2]], "output 1"),
    ([[0, 1, 0]], [[0, 1, 0], [2, 0, 1]], "output 2"),
])
def test_forward_outputs_nonfinite_in_one_run(a: Any, b: Any, label: str) -> None:
    found = DEFAULT.compare(forward(nonfinite=a), forward(nonfinite=b))
    assert found is not None and (found.kind, found.label) == ("nonfinite", label)


def test_forward_outputs_nonfinite_in_both_agree() -> None:
    assert DEFAULT.compare(forward(nonfinite=[[0, 3, 0]]),
                           forward(nonfinite=[[0, 3, 0]])) is None


def test_largest_of_several_calls() -> None:
    pairs = [(backward("a", out=[(1.0, 0.5)]), backward("a", out=[(1.1, 0.5)])),
             (backward("b", out=[(1.0, 0.5)]), backward("b", out=[(2.0, 0.5)])),
             (backward("c"), backward("c"))]
    worst = most_differing(DEFAULT.differing(pairs))
    assert worst is not None and (worst[0].fqn, worst[1]) == ("b", 0.5)
    assert most_differing(DEFAULT.differing([])) is None


def differs(name: str, rel: float) -> tuple[Event, Found]:
    return backward(name), Found("value", "grad_output 0", "norm", None, None, rel)


# -- Growth ----------------------------------------------------------------------------------------

def test_growth_samples_the_first_step_and_keeps_the_last() -> None:
    growth = Growth()
    growth.step(2, [differs(f"m{i}", 0.1 * (i + 1)) for i in range(9)])  # nine calls, step 2
    for step in range(3, 10):
        assert growth.wants(step) == (step < 7)
        if growth.wants(step):
            growth.step(step, [differs(f"s{step}", 0.5)])
        else:
            growth.defer(step, lambda step=step: (backward(f"s{step}"), 0.9))  # type: ignore[misc]
    profile = growth.profile()
    assert [(p["step"], p["module"]) for p in profile] == [
        (2, "m0"), (2, "m2"), (2, "m4"), (2, "m6"), (2, "m8"),  # five of nine, ends kept
        (3, "s3"), (4, "s4"), (5, "s5"), (6, "s6"), (9, "s9")]  # four later steps, the last


def test_growth_notes_later_steps_that_agree() -> None:
    growth = Growth()
    growth.step(0, [differs("a", 0.2)])
    growth.step(1, [])
    assert growth.profile()[-1] == {"step": 1, "module": None, "phase": None, "relative": 0.0}
    assert Growth().profile() == []


# -- the report's words ----------------------------------------------------------------------------

@pytest.mark.parametrize(("steps", "text"), [([], ""), ([3], "3"), ([0, 1, 2], "0-2"),
                                            ([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8")])
def test_ranges(steps: list[int], text: str) -> None:
    assert ranges(steps) == text


def test_report_of_runs_that_agree() -> None:
    report = DiffReport("a.jsonl", "b.jsonl", 0.002, 0.0, steps=[0])
    assert not report.differ
    assert diff_text(report) == (
        "hooktrace diff a.jsonl b.jsonl: 1 step compared (0)\n\n"
        "1. what ran: the same\n"
        "2. shapes and dtypes: the same (in the calls both runs made)\n"
        "3. numbers (rtol 0.002, atol 0): agree\n"
        "4. parameter-gradient norms: agree\n\n"
        "The runs agree.")


def test_report_sections_each_make_runs_differ() -> None:
    here = Difference("value", 1, "net", "", "backward", 0, "backward of (root) call 0: x",
                      "1", "2")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"renamed": [("net", "fc2", "head")]}, "what ran"),
        ({"shapes": Difference("dtypes", 0, "net", "fc", "forward", 0, "m", "a", "b", 0)},
         "shapes/dtypes"),
        ({"divergence": here}, "numbers"),
        ({"param_steps": 1, "params": [ParamDifference(0, "net", 4, [("fc", 1.0, None)])]},
         "parameter gradients"),
    ]
    for change, kind in cases:
        report = DiffReport("a", "b", 0.002, 0.0, steps=[0, 1], **change)
        assert report.differ
        assert diff_text(report).endswith(f"The runs differ: {kind}.")
    text = diff_text(DiffReport("a", "b", 0.002, 0.0, steps=[0, 1], param_steps=1, params=[
        ParamDifference(0, "net", 4, [("fc", 1.0, None)])]))
    assert "   step 0 · model 'net': fc 1 vs no gradient (and 3 more)" in text
    assert "   step 1 · model 'net' · (root)" in diff_text(
        DiffReport("a", "b", 0.002, 0.0, steps=[0, 1], divergence=here))

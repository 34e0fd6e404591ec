"""Aligning logs step by step (``hooktrace.log.align``), the engine of ``diff`` and of ``check`` on
several ranks: a log against itself, a renamed module matched, a change of order found at its
first call, numbers never looked at, watched and cut-off steps; ``parting`` and ``renames`` on
events built by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hooktrace.log.align import (
    Event,
    ModuleInfo,
    StepRecords,
    Walk,
    lockstep,
    parting,
    renames,
    signature,
)
from hooktrace.log.decoder import BackwardRows, ForwardRows
from hooktrace.log.reader import LogReader
from unit.logs import LOGS


def walk(name: str) -> Walk:
    return Walk(LogReader(LOGS / f"{name}.jsonl"))


def pairs(a: str, b: str) -> list[tuple[int, StepRecords | None, StepRecords | None]]:
    return [(step, x, y) for step, (x, y) in lockstep([walk(a), walk(b)])]


def event(name: str, call: int = 0, phase: str = "forward", ins: Any = ([2, 3],),
          dtypes: Any = ("float32",), stats: Any = None) -> Event:
    return Event("model", phase, name, call, list(ins), [[2, 3]], list(dtypes), ["float32"],
                 stats, stats, None)


# -- real logs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["diff_a", "gan", "long_run", "exploding", "eval_mode"])
def test_a_log_aligns_fully_with_itself(name: str) -> None:
    found = pairs(name, name)
    assert found
    for _, x, y in found:
        assert x is not None and y is not None
        assert x.step == y.step and x.events == y.events and not x.cut_off
        assert parting(x.events, y.events) is None


def test_steps_come_in_order_with_their_events_and_norms() -> None:
    steps = list(walk("diff_a").steps())
    assert [s.step for s in steps] == [0, 1, 2, 3, 4]
    first = steps[0]
    assert [e.describe() for e in first.events[:5]] == [
        "forward of fc1 call 0", "forward of act call 0", "forward of poison call 0",
        "forward of fc2 call 0", "forward of (root) call 0"]
    assert [e.phase for e in first.events] == ["forward"] * 5 + ["backward"] * 5
    assert set(first.params["model"]) == {"fc1", "fc2"}
    assert first.events[0].key == ("model", "forward", "fc1", 0)


def test_renamed_module_is_matched() -> None:
    a, b = walk("diff_a"), walk("diff_rename")
    found = list(lockstep([a, b]))
    mapping = renames(a.modules["model"], b.modules["model"])
    assert mapping == {"head": "fc2"}
    for _, (x, y) in found:
        assert x is not None and y is not None
        split = parting(x.events, y.events)
        assert split is not None and (split.kind, split.position) == ("ran", 3)
        assert (x.events[3].describe(), y.events[3].describe()) == (
            "forward of fc2 call 0", "forward of head call 0")
        renamed = [e._replace(fqn=mapping.get(e.fqn, e.fqn)) for e in y.events]
        assert parting(x.events, renamed) is None


def test_swapped_order_parts_at_the_first_call() -> None:
    a, b = walk("diff_a"), walk("diff_swap")
    for _, (x, y) in lockstep([a, b]):
        assert x is not None and y is not None
        split = parting(x.events, y.events)
        assert split is not None and (split.kind, split.position, split.ran) == ("ran", 0, 0)
        assert (x.events[0].describe(), y.events[0].describe()) == (
            "forward of fc1 call 0", "forward of act call 0")
        # the first call both made whose shapes differ, in A's order: act, on fc1's output in A
        assert split.shapes is not None
        at, in_a, in_b = split.shapes
        assert (at, in_a.describe(), in_b.describe()) == (1, "forward of act call 0",
                                                          "forward of act call 0")
        assert (in_a.ins, in_b.ins) == ([[4, 16]], [[4, 8]])
    assert renames(a.modules["model"], b.modules["model"]) == {}


@pytest.mark.parametrize(("name", "at", "theirs"), [
    ("diff_twice", 2, "forward of act call 1"),
    ("diff_extra", 3, "forward of extra call 0"),
])
def test_more_calls_part_where_they_begin(name: str, at: int, theirs: str) -> None:
    a, b = walk("diff_a"), walk(name)
    for _, (x, y) in lockstep([a, b]):
        assert x is not None and y is not None
        split = parting(x.events, y.events)
        assert split is not None and (split.kind, split.position) == ("ran", at)
        assert y.events[at].describe() == theirs
    assert renames(a.modules["model"], b.modules["model"]) == {}  # a new module is no rename


@pytest.mark.parametrize("name", ["diff_lr", "diff_nan", "diff_nostats"])
def test_numbers_are_not_what_aligns(name: str) -> None:
    found = pairs("diff_a", name)
    both = [(x, y) for _, x, y in found if x is not None and y is not None]
    assert both and all(parting(x.events, y.events) is None for x, y in both)
    assert all(signature(e) == signature(f) for x, y in both
               for e, f in zip(x.events, y.events, strict=True))


def test_a_run_with_fewer_recorded_steps_has_none_there() -> None:
    found = pairs("diff_a", "diff_nostats")
    assert [(step, x is not None, y is not None) for step, x, y in found] == [
        (0, True, True), (1, True, True), (2, True, True), (3, True, False), (4, True, False)]


def test_steps_with_nan_are_marked() -> None:
    assert [s.nonfinite for s in walk("diff_nan").steps()] == [False, False, False, True, True]
    assert not any(s.nonfinite for s in walk("diff_a").steps())


def test_watched_steps_carry_anomalies_only() -> None:
    steps = list(walk("long_run").steps())
    assert [s.step for s in steps] == [0, 1, *range(50, 60)]
    watched = steps[2:]
    assert all(not s.events and not s.params for s in watched)
    assert watched[0].anomalies == [("nonfinite-forward", "model", "norm", 0),
                                    ("nonfinite-backward", "model", "", 0)]
    assert all(not s.anomalies for s in steps[:2])


def test_keep_drops_steps_before_they_are_merged() -> None:
    merged = lockstep([walk("long_run"), walk("diff_a")], keep=lambda s: bool(s.events))
    assert [(step, x is not None, y is not None) for step, (x, y) in merged] == [
        (0, True, True), (1, True, True), (2, False, True), (3, False, True), (4, False, True)]


def test_gan_steps_hold_each_model() -> None:
    w = walk("gan")
    steps = list(w.steps())
    assert w.models == {0: "generator", 1: "discriminator", 2: "criterion"}
    assert all(set(s.params) == {"generator", "discriminator"} for s in steps)
    assert {e.model for e in steps[0].events} == {"generator", "discriminator", "criterion"}
    assert {e.model for e in steps[1].events if e.phase == "backward"} == {
        "generator", "discriminator", "criterion"}


def cut(tmp_path: Path, before: bytes, keep_it: bool = False) -> Path:
    """diff_a cut at the first line that starts with ``before`` (kept, or not)."""
    lines = (LOGS / "diff_a.jsonl").read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(before))
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b"".join(lines[:at + keep_it]))
    return path


def test_the_step_a_run_was_cut_off_in(tmp_path: Path) -> None:
    path = cut(tmp_path, b'{"type":"step","step":2,')
    steps = list(Walk(LogReader(path)).steps())
    assert [(s.step, s.cut_off) for s in steps] == [(0, False), (1, False), (2, True)]


def test_a_closed_step_is_not_cut_off_without_an_end(tmp_path: Path) -> None:
    path = cut(tmp_path, b'{"type":"step","step":2,', keep_it=True)
    reader = LogReader(path)
    steps = list(Walk(reader).steps())
    assert [(s.step, s.cut_off) for s in steps] == [(0, False), (1, False), (2, False)]
    assert reader.end is None and "no end record" in reader.warnings[0]


def test_drain_feeds_what_the_steps_did_not_read() -> None:
    fed: list[Any] = []
    w = Walk(LogReader(LOGS / "diff_a.jsonl"), feed=fed.append)
    first = next(w.steps())
    assert first.step == 0
    w.drain()
    everything = list(LogReader(LOGS / "diff_a.jsonl").scan())

    def shape(items: list[Any]) -> list[Any]:
        return [(type(i).__name__, len(i)) if isinstance(i, (ForwardRows, BackwardRows))
                else i for i in items]

    assert shape(fed) == shape(everything)


def test_drain_before_steps_feeds_everything() -> None:
    fed: list[Any] = []
    Walk(LogReader(LOGS / "vae.jsonl"), feed=fed.append).drain()
    assert len(fed) == len(list(LogReader(LOGS / "vae.jsonl").scan()))


# -- by hand --------------------------------------------------------------------------------------

def test_events_agreeing_but_in_numbers_do_not_part() -> None:
    a = [event("fc1", phase="backward", stats=[[1.0, 0.5]])]
    b = [event("fc1", phase="backward", stats=[[9.0, 7.5]])]
    assert parting(a, b) is None


def test_other_shapes_of_the_same_calls() -> None:
    a = [event("fc1"), event("fc2")]
    b = [event("fc1"), event("fc2", ins=([2, 4],))]
    split = parting(a, b)
    assert split is not None and (split.kind, split.position, split.ran) == ("shapes", 1, None)


def test_other_dtypes_of_the_same_calls() -> None:
    split = parting([event("fc1")], [event("fc1", dtypes=("bfloat16",))])
    assert split is not None and (split.kind, split.position) == ("dtypes", 0)


def test_a_shorter_step_parts_past_its_end() -> None:
    split = parting([event("fc1"), event("fc2")], [event("fc1")])
    assert split is not None and (split.kind, split.position, split.ran) == ("ran", 1, 1)


def test_a_change_of_order_reports_shapes_only_if_they_come_first() -> None:
    a = [event("fc1"), event("fc2", ins=([2, 4],))]
    b = [event("fc2"), event("fc1")]
    split = parting(a, b)
    assert split is not None and split.kind == "ran" and split.position == 0
    assert split.shapes is not None and split.shapes[0] == 1  # fc2, matched by its call


def test_renames_pair_by_class_and_params_in_order() -> None:
    a = {"": ModuleInfo("Net", 0, 0), "fc": ModuleInfo("Linear", 10, 1),
         "bn": ModuleInfo("BatchNorm1d", 4, 2), "out": ModuleInfo("Linear", 10, 3)}
    b = {"": ModuleInfo("Net", 0, 0), "dense": ModuleInfo("Linear", 10, 1),
         "norm": ModuleInfo("LayerNorm", 4, 2), "head": ModuleInfo("Linear", 10, 3)}
    assert renames(a, b) == {"dense": "fc", "head": "out"}  # not bn: another class
    c = {**a, "fc": ModuleInfo("Linear", 11, 1)}
    assert renames(c, b) == {"dense": "out"}  # another parameter count: not fc
    assert renames(a, a) == {}


def test_another_class_in_the_same_place_parts_in_what_ran() -> None:
    """``model[1] = nn.GELU()`` in one run, a ReLU in the other: the same call, not the same
    module; a new module of the same class is."""
    a = [event("fc1"), event("act")._replace(cls="ReLU")]
    b = [event("fc1"), event("act")._replace(cls="GELU")]
    split = parting(a, b)
    assert split is not None and (split.kind, split.position, split.ran) == ("ran", 1, 1)
    assert parting(a, [event("fc1"), event("act")._replace(cls="ReLU")]) is None

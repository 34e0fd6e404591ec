"""Two healthy recipes of several models or calls, on hand-built logs (issue 36, item 5): a
GAN that freezes its discriminator around the generator's pass and unfreezes it for its own
(the run ends in a frozen turn: no ``frozen-during-run``), and a module called again after the
call that trains it, whose result is only looked at (the last call in its parent's forward,
nothing without autograd history in the parent's output); their bugs stay found: a freeze that
nothing undoes, a loop that throws the earlier calls' results away, a detached call that a
later call reads or that is added into the output."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hooktrace.log import schema

from .logbuild import CHAIN, C, chain, header, signal, summary, write_log


def freezes(turns: int) -> list[object]:
    """fc1 and fc2 frozen at odd steps, unfrozen at even ones, ``turns`` freezes in all."""
    out = []
    for i in range(turns):
        out.append(signal("trainable-changed", 2 * i + 1, frozen=["fc1", "fc2"], unfrozen=[]))
        if i < turns - 1:
            out.append(signal("trainable-changed", 2 * i + 2, frozen=[], unfrozen=["fc1", "fc2"]))
    return out


def test_a_discriminator_frozen_in_turns_is_silent(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain() for _ in range(8)], signals=freezes(4))
    assert [k for k, *_ in summary(path)] == []


def test_a_freeze_nothing_undoes_is_said(tmp_path: Path) -> None:
    signals = [signal("trainable-changed", 2, frozen=["fc1", "fc2"], unfrozen=[])]
    path = write_log(tmp_path / "log.jsonl", [chain() for _ in range(4)], signals=signals)
    assert ("frozen-during-run", "warning", "fc1", 2) in summary(path)


MONITORED = [("", "Monitored", 0), ("body", "Net", 0), *((f"body.{n}", cls, p)
                                                           for n, cls, p in CHAIN[1:])]


def body(fed: bool) -> list[C]:
    """One call of body: fc1, act, fc2, body; fed or with no backward at all."""
    if fed:
        return [C("body.fc1", g_in=None), C("body.act"), C("body.fc2"), C("body")]
    return [C(name, g_out=None, g_in=None) for name in ("body.fc1", "body.act", "body.fc2",
                                                          "body")]


#: a log whose forward events say what went into their outputs without autograd history
SAYS = replace(header(), made_no_history=True)


Found = list[tuple[str, str, str, int | None]]


def twice(tmp_path: Path, *after: C, root: C | None = None, head: schema.Header = SAYS,
          modules: list[tuple[str, str, int]] = MONITORED) -> Found:
    """The findings of 3 steps of body called twice, the second call without backward, then
    the calls ``after`` it and ``root``."""
    steps = [[*body(True), *body(False), *after, root or C("")] for _ in range(3)]
    path = write_log(tmp_path / "log.jsonl", steps, modules=modules, head=head)
    return summary(path)


def test_a_call_after_the_one_that_trains_only_looked_at_is_silent(tmp_path: Path) -> None:
    assert twice(tmp_path) == [("called-several-times", "note", "body.fc1", None)]


def test_a_detached_call_added_into_the_output_is_said(tmp_path: Path) -> None:
    """``return a + self.body(x2).detach()``: an edge without history on the way back."""
    found = twice(tmp_path, root=C("", made_no_history=True))
    assert ("no-grad", "warning", "", 0) in found


def test_a_detached_call_a_later_call_reads_is_said(tmp_path: Path) -> None:
    """flow_bugs' shared_detached: the head runs after the detached call, and may read it."""
    found = twice(tmp_path, C("head"), modules=[*MONITORED, ("head", "Linear", 20)])
    assert ("no-grad", "warning", "", 0) in found


def test_a_log_that_does_not_say_what_went_in_without_history_is_said(tmp_path: Path) -> None:
    """A log from before ``made_no_history``, or one with fqn filters (calls not traced may
    read the detached output): the warning as before."""
    assert ("no-grad", "warning", "", 0) in twice(tmp_path, head=header())
    filtered = replace(SAYS, options={**SAYS.options, "exclude": ["head"]})
    assert ("no-grad", "warning", "", 0) in twice(tmp_path, head=filtered)


def test_calls_before_the_one_that_trains_thrown_away_are_said(tmp_path: Path) -> None:
    steps = [[*body(False), *body(True), C("")] for _ in range(3)]
    path = write_log(tmp_path / "log.jsonl", steps, modules=MONITORED)
    assert ("no-grad", "warning", "", 0) in summary(path)

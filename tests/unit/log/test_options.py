"""What to record: ``Steps`` parsed from ``--steps`` text and its membership, ``TraceOptions``'
fqn filters, and the options written to a log's header read back (also from the checked-in logs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.options import DEFAULT_MAX_EVENTS, DEFAULT_STEPS, Steps, TraceOptions
from hooktrace.log.reader import LogReader
from hooktrace.log.writer import LogWriter
from unit.logs import LOGS


def selected(steps: Steps, upto: int = 200) -> list[int]:
    return [s for s in range(upto) if s in steps]


# -- Steps ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("0:3", [0, 1, 2]),
    ("5", [5]),
    ("0,100:102", [0, 100, 101]),
    (":2", [0, 1]),
    ("10:12, 3", [3, 10, 11]),
    (" 0:3 ", [0, 1, 2]),
])
def test_steps_parse_selects_exactly_these_steps(text: str, expected: list[int]) -> None:
    assert selected(Steps.parse(text)) == expected


def test_steps_ranges_are_sorted_and_text_kept_stripped() -> None:
    steps = Steps.parse(" 10:12,0:2 ")
    assert steps.ranges == ((0, 2), (10, 12))
    assert steps.text == "10:12,0:2"


@pytest.mark.parametrize("text", ["all", " all ", "0:", ":"])
def test_steps_without_an_end_select_every_step(text: str) -> None:
    steps = Steps.parse(text)
    assert steps.ranges == ((0, None),)
    assert all(s in steps for s in (0, 1, 59, 10**9))
    assert steps.last is None


def test_steps_open_range_starts_where_it_says() -> None:
    steps = Steps.parse("20:")
    assert 19 not in steps and 20 in steps and 10**6 in steps
    assert steps.last is None


@pytest.mark.parametrize("text", [None, "", "   "])
def test_steps_default_is_the_first_ten(text: str | None) -> None:
    steps = Steps.parse(text)
    assert steps.text == DEFAULT_STEPS
    assert selected(steps) == list(range(10))


@pytest.mark.parametrize(("text", "last"), [("0:3", 2), ("0,100:102", 101), ("7", 7),
                                            ("0:3,10:", None)])
def test_steps_last(text: str, last: int | None) -> None:
    assert Steps.parse(text).last == last


@pytest.mark.parametrize(("bad", "look_alike", "message"), [
    ("x", "all", "expected steps like 0:3, 5 or 10:"),
    ("ALL", "all", "expected steps like"),
    ("1.5", "1:5", "expected steps like"),
    ("0:3;5", "0:3,5", "expected steps like"),
    ("0:3,x", "0:3,4", "expected steps like"),
    ("3:3", "3:4", "'3:3' selects no step"),
    ("5:2", "2:5", "'5:2' selects no step"),
    ("-1", "0", "'-1' selects no step"),
    ("-2:4", "0:4", "'-2:4' selects no step"),
])
def test_steps_rejects_bad_text_with_one_line(bad: str, look_alike: str, message: str) -> None:
    Steps.parse(look_alike)  # accepted
    with pytest.raises(HooktraceError) as info:
        Steps.parse(bad)
    text = str(info.value)
    assert message in text
    assert text.startswith(f"--steps {bad!r}: ")
    assert "\n" not in text and info.value.exit_code == 2


def test_steps_error_on_text_with_a_newline_stays_one_line() -> None:
    with pytest.raises(HooktraceError) as info:
        Steps.parse("0:3\n5")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "steps"), [("5,", [5]), ("0:2,,7", [0, 1, 7]), (" ,3", [3]),
                                             ("0,", [0]), (":1,4", [0, 4])])
def test_steps_empty_item_does_not_select_step_zero(text: str, steps: list[int]) -> None:
    """A stray comma is left out: it never selects step 0 (which "0" and ":1" still do)."""
    assert selected(Steps.parse(text)) == steps


@pytest.mark.parametrize("bad", [",", " , "])
def test_steps_of_empty_items_only_are_refused(bad: str) -> None:
    with pytest.raises(HooktraceError, match="expected steps like"):
        Steps.parse(bad)


ranges = st.lists(st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(1, 20))),
                  min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(parts=ranges)
def test_steps_membership_is_the_union_of_its_ranges(
        parts: list[tuple[int, int | None]]) -> None:
    text = ",".join(f"{a}" if n == 1 else f"{a}:" if n is None else f"{a}:{a + n}"
                    for a, n in parts)
    expected = {s for a, n in parts for s in range(200)
                if s >= a and (n is None or s < a + n)}
    steps = Steps.parse(text)
    assert set(selected(steps)) == expected
    ends = [None if n is None else a + n - 1 for a, n in parts]
    assert steps.last == (None if None in ends else max(e for e in ends if e is not None))


# -- TraceOptions ---------------------------------------------------------------------------------

def test_trace_options_defaults_and_their_header() -> None:
    options = TraceOptions()
    assert (options.max_events, options.stats, options.watch, options.break_on_nan) == (
        DEFAULT_MAX_EVENTS, True, True, False)
    assert options.to_header() == {"max_events": DEFAULT_MAX_EVENTS, "stats": True,
                                   "watch": True, "steps": DEFAULT_STEPS}


def test_trace_options_without_stats_do_not_watch() -> None:
    assert TraceOptions(stats=False).to_header()["watch"] is False
    assert TraceOptions(stats=True, watch=False).to_header()["watch"] is False


def test_trace_options_every_step_leaves_steps_out_of_the_header() -> None:
    assert "steps" not in TraceOptions(steps=Steps()).to_header()
    assert TraceOptions(steps=Steps.parse("all")).to_header()["steps"] == "all"


@pytest.mark.parametrize(("bad", "look_alike"), [(0, 1), (-5, 1)])
def test_trace_options_rejects_max_events_below_one(bad: int, look_alike: int) -> None:
    assert TraceOptions(max_events=look_alike).max_events == look_alike
    with pytest.raises(HooktraceError, match="--max-events must be at least 1"):
        TraceOptions(max_events=bad)


@pytest.mark.parametrize(("include", "exclude", "fqn", "matches"), [
    ((), (), "", True),
    (("Conv2d",), (), "conv1", True),  # by class: every Conv2d (this module's class)
    (("Conv*",), (), "features.0", True),
    (("conv*",), (), "features.0", False),  # a class is CamelCase: conv* names fqns
    (("Linear",), (), "conv1", False),
    ((), ("Conv2d",), "conv1", False),
    (("*",), ("Dropout",), "conv1", True),
    ((), (), "block.0.conv", True),
    (("fc*",), (), "fc1", True),
    (("fc*",), (), "conv1", False),
    (("fc*",), (), "", False),  # the root is no exception to --include
    (("fc*",), (), "FC1", False),  # globs are case-sensitive, as fqns are
    (("block.*",), (), "block.0.conv", True),  # '*' crosses dots
    (("fc*",), ("fc2",), "fc2", False),  # exclude wins
    (("fc*",), ("fc2",), "fc1", True),
    ((), ("*.bn",), "layer1.bn", False),
    ((), ("*.bn",), "layer1.bn2", True),
])
def test_trace_options_matches(include: tuple[str, ...], exclude: tuple[str, ...], fqn: str,
                               matches: bool) -> None:
    options = TraceOptions(include=include, exclude=exclude)
    assert options.matches(fqn, "Conv2d") is matches


def options_from_header(header: dict[str, Any]) -> dict[str, Any]:
    """The TraceOptions fields a header's options give back (how readers read them)."""
    return {
        "include": tuple(header.get("include", ())), "exclude": tuple(header.get("exclude", ())),
        "steps": Steps.parse(header["steps"]) if "steps" in header else Steps(),
        "max_events": header["max_events"], "stats": header["stats"], "watch": header["watch"],
        "break_on_nan": header.get("break_on") == "nan",
        "capture": tuple(header.get("capture", ())), "ops": tuple(header.get("ops", ())),
        "probe": header.get("probe", False), "time": header.get("time", False),
        "run": header.get("run"),
    }


def test_every_option_survives_the_log_header(tmp_path: Path) -> None:
    options = TraceOptions(include=("fc*", "conv?"), exclude=("fc2",),
                           steps=Steps.parse("0,100:102"), max_events=5, stats=True, watch=True,
                           break_on_nan=True, capture=("conv1",), ops=("act*",), probe=True,
                           time=True, run="module")
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0",
                               options=options.to_header()))
    writer.close()
    read = LogReader(path).header.options
    assert read == options.to_header()
    back = TraceOptions(**options_from_header(read))
    # capture_max_mb and strict are how the tracer behaves, not what it recorded: not written
    assert back == options
    assert selected(back.steps) == [0, 100, 101]


def test_default_options_survive_the_log_header(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0",
                               options=TraceOptions().to_header()))
    writer.close()
    assert TraceOptions(**options_from_header(LogReader(path).header.options)) == TraceOptions()


@pytest.mark.parametrize(("name", "options"), [
    ("mnist", TraceOptions(time=True, run="script")),
    ("crash", TraceOptions(run="script")),
    ("ops", TraceOptions(ops=("branch_b*",), run="script")),
    ("long_run", TraceOptions(steps=Steps.parse("0:2"), run="script")),
    ("diff_nostats", TraceOptions(stats=False, watch=False, steps=Steps.parse("0:3"),
                                  run="script")),
])
def test_checked_in_headers_hold_the_options_they_ran_with(name: str,
                                                           options: TraceOptions) -> None:
    header = LogReader(LOGS / f"{name}.jsonl").header.options
    assert header == options.to_header()
    assert TraceOptions(**options_from_header(header)) == options


# -- read back and given: from_header, from_flags --------------------------------------------------

def _header(**options: Any) -> schema.Header:
    return schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0", options=options)


@pytest.mark.parametrize("options", [
    TraceOptions(),
    TraceOptions(include=("fc*", "conv?"), exclude=("fc2",), steps=Steps.parse("0,100:102"),
                 max_events=5, break_on_nan=True, capture=("conv1",), ops=("act*",),
                 probe=True, run="module"),
    TraceOptions(stats=False, watch=False, steps=Steps(), run="script"),
    TraceOptions(steps=Steps.parse("all")),
])
def test_from_header_reads_back_what_to_header_wrote(options: TraceOptions) -> None:
    assert TraceOptions.from_header(_header(**options.to_header())) == options


@pytest.mark.parametrize(("name", "options"), [
    ("mnist", TraceOptions(time=True, run="script")),
    ("ops", TraceOptions(ops=("branch_b*",), run="script")),
    ("diff_nostats", TraceOptions(stats=False, watch=False, steps=Steps.parse("0:3"),
                                  run="script")),
])
def test_from_header_of_checked_in_logs(name: str, options: TraceOptions) -> None:
    assert TraceOptions.from_header(LogReader(LOGS / f"{name}.jsonl").header) == options


def test_from_header_of_an_older_log_is_what_hooktrace_did_then() -> None:
    """No options at all: every module and every step, statistics, no watching."""
    read = TraceOptions.from_header(_header())
    assert (read.include, read.exclude, read.stats, read.watch, read.run) == (
        (), (), True, False, None)
    assert read.steps == Steps() and 10**6 in read.steps and not read.filtered


@pytest.mark.parametrize(("steps", "selects", "text"), [
    ("0:2", [0, 1], "0:2"),
    ("junk", [], "junk"),  # a selection this hooktrace cannot read selects none, said as it was
    (None, list(range(200)), ""),
    (3, list(range(200)), ""),
])
def test_from_header_steps(steps: object, selects: list[int], text: str) -> None:
    read = TraceOptions.from_header(_header(steps=steps)).steps
    assert (selected(read), read.text) == (selects, text)


def test_from_header_is_tolerant_of_odd_values() -> None:
    read = TraceOptions.from_header(_header(include="fc*", max_events=0, run=3, stats=None))
    assert (read.include, read.max_events, read.run, read.stats) == (
        (), DEFAULT_MAX_EVENTS, None, False)
    assert TraceOptions.from_header(_header(exclude=["head"])).filtered


def test_from_flags_is_what_run_and_trace_give() -> None:
    flags: dict[str, Any] = {
        "include": ["fc*"], "exclude": (), "steps": "0,5", "max_events": 7, "stats": True,
        "watch": False, "break_on": "nan", "capture": (), "capture_max_mb": 3, "strict": True,
        "ops": ["act*"], "probe": False, "time": True, "run": "script"}
    assert TraceOptions.from_flags(**flags) == TraceOptions(
        include=("fc*",), steps=Steps.parse("0,5"), max_events=7, watch=False,
        break_on_nan=True, capture_max_mb=3, strict=True, ops=("act*",), time=True, run="script")
    with pytest.raises(HooktraceError, match="break_on='inf': only 'nan' is supported"):
        TraceOptions.from_flags(**{**flags, "break_on": "inf"})

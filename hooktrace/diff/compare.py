"""Compare two logs and say where the runs part ways: what ran, shapes and dtypes, numbers,
parameter gradients, each from its first difference.

The logs are read in lockstep through ``hooktrace.log.align``, one step of each in memory at a time.
Calls are matched by model name, phase, fqn and call index; a module renamed between the runs
is matched under its old name and reported once. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hooktrace.diff.numbers import Found, Growth, Tolerance, most_differing, param_differences
from hooktrace.log.align import Event, Key, StepRecords, Walk, lockstep, parting, renames
from hooktrace.log.errors import HooktraceError
from hooktrace.log.options import TraceOptions
from hooktrace.log.reader import LogReader
from hooktrace.log.schema import AnomalyKind
from hooktrace.log.words import fqn_text, ranges

DEFAULT_RTOL = 2e-3  # the statistics are written to 4 significant digits: one rounding step
DEFAULT_ATOL = 0.0
_CONTEXT = 2  # events shown on each side of the first difference in what ran


@dataclass
class Difference:
    """The first difference of one kind: where, and what each run had there."""

    kind: str  # ran | shapes | dtypes | value | nonfinite
    step: int
    model: str
    module: str  # the fqn as run A names it
    phase: str
    call: int
    message: str
    a: str  # what run A had there
    b: str
    position: int | None = None  # index of the event within its step (what ran)


@dataclass
class ParamDifference:
    """Parameter-gradient norms of one step and model that differ: (fqn, A's, B's), the first
    few, and how many modules differ in all."""

    step: int
    model: str
    count: int
    modules: list[tuple[str, float | None, float | None]]


@dataclass
class DiffReport:
    a: str
    b: str
    rtol: float
    atol: float
    steps: list[int] = field(default_factory=list)  # compared
    renamed: list[tuple[str, str, str]] = field(default_factory=list)  # (model, A's, B's fqn)
    ran: Difference | None = None
    shapes: Difference | None = None
    divergence: Difference | None = None  # the first number past the tolerance, or NaN/Inf
    nonfinite: Difference | None = None  # the first NaN/Inf in one run only
    growth: list[dict[str, Any]] = field(default_factory=list)
    params: list[ParamDifference] = field(default_factory=list)
    param_steps: int = 0  # steps whose parameter-gradient norms differ
    not_compared: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def differ(self) -> bool:
        return bool(self.renamed or self.ran or self.shapes or self.divergence
                    or self.nonfinite or self.param_steps)

    def to_dict(self) -> dict[str, Any]:
        return {"differ": self.differ, **asdict(self)}


_PARAM_STEPS_KEPT = 20  # per-step parameter differences kept in the report (the count is exact)


class _Comparison:
    """What has been found so far, step after step."""

    def __init__(self, report: DiffReport, numbers: bool) -> None:
        self.report = report
        self.numbers = numbers
        self.growth = Growth()
        self.tolerance = Tolerance(report.rtol, report.atol)

    def step(self, step: int, a: StepRecords, b: StepRecords) -> None:
        self.report.steps.append(step)
        if a.events == b.events and a.params == b.params and a.anomalies == b.anomalies:
            self.growth.step(step, [])
            return
        if self.report.ran is None or self.report.shapes is None:
            found = parting(a.events, b.events)
            if found is not None and found.ran is not None and self.report.ran is None:
                self._what_ran(step, a.events, b.events, found.ran)
            if found is not None and found.shapes is not None and self.report.shapes is None:
                self.report.shapes = _shapes(step, *found.shapes)
        if not self.numbers:
            return
        self._anomalies(step, a, b)
        self._params(step, a.params, b.params)
        pairs = _pairs(a.events, b.events)
        if self.growth.wants(step) or (self.report.nonfinite is None
                                       and (a.nonfinite or b.nonfinite)):
            differing = self.tolerance.differing(pairs)
            for event, difference in differing:
                self._divergence(step, event, difference)
            self.growth.step(step, differing)
        else:  # the report's sections are decided: only the growth profile may want this step
            tolerance = self.tolerance
            self.growth.defer(step, lambda: most_differing(tolerance.differing(pairs)))

    def _what_ran(self, step: int, a: list[Event], b: list[Event], i: int) -> None:
        here_a, here_b = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        keys_a, keys_b = {e.key for e in a}, {e.key for e in b}
        if here_b is not None and here_b.key not in keys_a:
            named, what = here_b, _only(here_b, "B", keys_a)
        elif here_a is not None and here_a.key not in keys_b:
            named, what = here_a, _only(here_a, "A", keys_b)
        elif here_a is not None and here_b is not None and here_a.key == here_b.key:
            named = here_a  # another module in its place (``model[1] = nn.GELU()``)
            what = f"{here_a.describe()}: {here_a.cls} in A, {here_b.cls} in B"
        else:
            assert here_a is not None and here_b is not None
            named = here_a
            what = (f"another order: A ran {here_a.describe()} where B ran "
                    f"{here_b.describe()}")
        self.report.ran = Difference("ran", step, named.model, named.fqn, named.phase,
                                     named.call, what, _context(a, i), _context(b, i), i)

    def _divergence(self, step: int, a: Event, found: Found) -> None:
        """The first number past the tolerance, and the first NaN/Inf in one run only."""
        if self.report.divergence is None or (found.kind == "nonfinite"
                                              and self.report.nonfinite is None):
            what, value_a, value_b = found.words()
            difference = Difference(found.kind, step, a.model, a.fqn, a.phase, a.call,
                                    f"{a.describe()}: {what}", value_a, value_b)
            if found.kind == "nonfinite" and self.report.nonfinite is None:
                self.report.nonfinite = difference
            if self.report.divergence is None:
                self.report.divergence = difference

    def _anomalies(self, step: int, a: StepRecords, b: StepRecords) -> None:
        """Watched steps: a NaN/Inf anomaly in one run only."""
        odd = sorted({x for x in a.anomalies if x[0] != AnomalyKind.NO_GRAD}
                     ^ {x for x in b.anomalies if x[0] != AnomalyKind.NO_GRAD})
        if not odd:
            return
        kind, model, name, call = odd[0]
        run = "A" if odd[0] in a.anomalies else "B"
        difference = Difference(
            "nonfinite", step, model, name, kind.removeprefix("nonfinite-"), call,
            f"{kind} anomaly in {run} only (a watched step)",
            "NaN/Inf" if run == "A" else "finite", "NaN/Inf" if run == "B" else "finite")
        self.report.nonfinite = self.report.nonfinite or difference
        self.report.divergence = self.report.divergence or difference

    def _params(self, step: int, a: dict[str, dict[str, float | None]],
                b: dict[str, dict[str, float | None]]) -> None:
        found = False
        for model in sorted(a.keys() & b.keys()):
            differ = param_differences(a[model], b[model], self.tolerance)
            if differ:
                found = True
                if len(self.report.params) < _PARAM_STEPS_KEPT:
                    self.report.params.append(ParamDifference(step, model, len(differ),
                                                              differ[:3]))
        self.report.param_steps += found


def _pairs(a: list[Event], b: list[Event]) -> Iterator[tuple[Event, Event]]:
    """The calls both runs made whose events differ, in A's order: (A's event, B's)."""
    by_key = {e[:4]: e for e in b}
    for event in a:
        other = by_key.get(event[:4])
        if other is not None and other != event:
            yield event, other


def _only(event: Event, run: str, other_keys: set[Key]) -> str:
    """What ran in one run only: a call more, or a module the other run did not call."""
    calls = sum(1 for k in other_keys if k[:3] == event.key[:3])
    other = "A" if run == "B" else "B"
    if calls:
        return (f"{fqn_text(event.fqn)} has more {event.phase} calls in {run} than in "
                f"{other} ({other}: {calls}): {event.describe()} ran in {run} only")
    return f"{event.describe()} ran in {run} only"


def _short(e: Event) -> str:
    return f"{e.phase} {fqn_text(e.fqn)} #{e.call}"


def _context(events: list[Event], i: int) -> str:
    """The events around position ``i``, the one at ``i`` in brackets."""
    shown = [_short(e) for e in events[max(0, i - _CONTEXT):i]]
    shown.append(f"[{_short(events[i])}]" if i < len(events) else "[nothing: its step ended]")
    shown += [_short(e) for e in events[i + 1:i + 1 + _CONTEXT]]
    return (" · ".join(shown) + (" · ..." if i + 1 + _CONTEXT < len(events) else "")
            if shown else "")


def _shapes(step: int, position: int, a: Event, b: Event) -> Difference:
    """The first call both runs made whose shapes or dtypes differ (``align.parting``)."""
    if a.ins != b.ins or a.outs != b.outs:
        kind, value_a, value_b = "shapes", f"{a.ins} -> {a.outs}", f"{b.ins} -> {b.outs}"
    else:
        kind = "dtypes"
        value_a = f"{_dtypes(a.in_dtypes)} -> {_dtypes(a.out_dtypes)}"
        value_b = f"{_dtypes(b.in_dtypes)} -> {_dtypes(b.out_dtypes)}"
    what = "grad_input/grad_output" if a.phase == "backward" else "input/output"
    return Difference(kind, step, a.model, a.fqn, a.phase, a.call,
                      f"{a.describe()}: the {what} {kind} differ", value_a, value_b, position)


def _dtypes(dtypes: Sequence[str]) -> str:
    return "[" + ", ".join(dtypes) + "]"


def diff(a: str | os.PathLike[str], b: str | os.PathLike[str], step: int | None = None,
         model: str | None = None, rtol: float = DEFAULT_RTOL,
         atol: float = DEFAULT_ATOL) -> DiffReport:
    """Compare the logs ``a`` and ``b`` (optionally one step, one model)."""
    readers = (LogReader(a), LogReader(b))
    if readers[0].header.schema != readers[1].header.schema:
        raise HooktraceError(f"{a} and {b} have different log schemas "
                             f"({readers[0].header.schema}, {readers[1].header.schema})")
    report = DiffReport(str(a), str(b), rtol, atol)
    options = [TraceOptions.from_header(r.header) for r in readers]
    compare = _Comparison(report, numbers=all(o.stats for o in options))
    walks = (Walk(readers[0]), Walk(readers[1]))
    only: dict[str, list[int]] = {"A": [], "B": []}
    whole: dict[str, list[int]] = {"A": [], "B": []}  # run -> the steps it finished
    cut: dict[str, int] = {}  # run -> the step it was cut off in
    known: dict[tuple[str, int, int], dict[str, str]] = {}
    for number, (in_a, in_b) in lockstep(walks, keep=lambda s: step is None or s.step == step):
        for run, records in zip("AB", (in_a, in_b), strict=True):
            if records is not None and records.cut_off:
                cut[run] = number
            elif records is not None:
                whole[run].append(number)
        if in_a is None or in_b is None:
            lacking = 0 if in_a is None else 1
            if not _watched_clean(walks[lacking], options[lacking], in_a or in_b):
                only["A" if in_b is None else "B"].append(number)
                continue
            in_a, in_b = in_a or StepRecords(number), in_b or StepRecords(number)
        if in_a.cut_off or in_b.cut_off:  # an unfinished step: what it lacks is no difference
            continue
        _select(in_a, model)
        _select(in_b, model)
        _rename(in_b, walks, report, known)
        compare.step(number, in_a, in_b)
    _check_found(report, walks, step, model, whole, cut)
    _not_compared(report, only, cut, options)
    report.growth = compare.growth.profile()
    report.warnings = [w for r in readers for w in r.warnings]
    return report


def _watched_clean(walk: Walk, options: TraceOptions, other: StepRecords | None) -> bool:
    """Whether the run of ``walk`` watched the step the other run has ``other`` of, a watched
    step of its own (anomalies only), and found nothing: a healthy watched step leaves no
    record. It ran that step when it has records of a later one, or its end says so."""
    assert other is not None
    step, end = other.step, walk.reader.end
    return (not other.events and not other.params and options.watch
            and step not in options.steps
            and (walk.reached > step or (end is not None and end.steps > step)))


def _select(records: StepRecords, model: str | None) -> None:
    if model is not None:
        records.events = [e for e in records.events if e.model == model]
        records.params = {m: p for m, p in records.params.items() if m == model}


def _rename(b: StepRecords, walks: tuple[Walk, Walk], report: DiffReport,
            known: dict[tuple[str, int, int], dict[str, str]]) -> None:
    """B's events and norms under A's names, for modules renamed between the runs; ``known``
    keeps each model's renames until a log declares more modules."""
    for model in sorted(walks[1].modules):
        modules_a, modules_b = walks[0].modules.get(model, {}), walks[1].modules.get(model, {})
        mapping = known.get((model, len(modules_a), len(modules_b)))
        if mapping is None:
            mapping = known[model, len(modules_a), len(modules_b)] = renames(modules_a,
                                                                             modules_b)
        if not mapping:
            continue
        for new, old in mapping.items():
            entry = (model, old, new)
            if entry not in report.renamed and not _implied(entry, report.renamed):
                report.renamed.append(entry)
        b.events = [e._replace(fqn=mapping.get(e.fqn, e.fqn)) if e.model == model else e
                    for e in b.events]
        if model in b.params:
            b.params[model] = {mapping.get(k, k): v for k, v in b.params[model].items()}


def _implied(entry: tuple[str, str, str], known: list[tuple[str, str, str]]) -> bool:
    """``block.0 -> stage.0`` follows from ``block -> stage``."""
    model, old, new = entry
    return any(m == model and old.startswith(o + ".") and new == n + old[len(o):]
               for m, o, n in known)


def _check_found(report: DiffReport, walks: tuple[Walk, Walk], step: int | None,
                 model: str | None, whole: dict[str, list[int]], cut: dict[str, int]) -> None:
    if model is not None and not any(model in w.modules for w in walks):
        have = sorted({m for w in walks for m in w.modules})
        raise HooktraceError(f"no model {model!r} in {report.a} or {report.b}; their models: "
                             f"{', '.join(have) or 'none'}")
    if report.steps:
        return
    if step is not None:
        runs = " and ".join(run for run, at in cut.items() if at == step)
        raise HooktraceError(f"step {step} was cut off in {runs}" if runs
                             else f"step {step} is not in both logs")
    steps = "; ".join(f"{run}: {_steps_of(whole[run], cut.get(run))}" for run in "AB")
    raise HooktraceError(f"{report.a} and {report.b} have no step in common ({steps})")


def _steps_of(whole: list[int], cut: int | None) -> str:
    """The steps a run finished and where it was cut off, for the error of no step in common."""
    if cut is None:
        return f"steps {ranges(whole)}" if whole else "no step"
    if whole:
        return f"steps {ranges(whole)}, cut off in step {cut}"
    return f"cut off in step {cut}, before it finished a step"


def _not_compared(report: DiffReport, only: dict[str, list[int]], cut: dict[str, int],
                  options: list[TraceOptions]) -> None:
    for at in sorted(set(cut.values())):
        runs = " and ".join(run for run in "AB" if cut.get(run) == at)
        report.not_compared.append(f"step {at}: cut off in {runs} (the run did not finish it)")
    for run, steps in only.items():
        if not steps:
            continue
        other = "B" if run == "A" else "A"  # the run that lacks the steps: why it does
        if other in cut and cut[other] < steps[0]:
            why = f"{other} was cut off in step {cut[other]}"
        else:
            why = f"{other} recorded with --steps {options['AB'.index(other)].steps.text or '?'}"
        report.not_compared.append(f"steps {ranges(steps)}: only in {run} ({why})")
    missing = [run for run, o in zip("AB", options, strict=True) if not o.stats]
    if missing:
        report.not_compared.append(
            f"numbers and parameter gradients: {' and '.join(missing)} recorded with "
            "--no-stats")

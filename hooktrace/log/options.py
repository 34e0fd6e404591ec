"""What to record: module filters (by fqn or class), the steps to record and a cap on events.
Standard library only.

``TraceOptions`` is the one home of the trace options: their defaults (which ``hooktrace run``'s
flags and ``hooktrace.trace``'s keywords show), the user's values read in (``from_flags``), and
the log header's ``options`` written (``to_header``) and read back (``from_header``): nothing
outside ``hooktrace.log`` reads a header option by its key.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hooktrace.log.errors import HooktraceError
from hooktrace.log.schema import Header

DEFAULT_MAX_EVENTS = 1_000_000  # ~200 MB of log; a safety cap, not a target
DEFAULT_STEPS = "0:10"  # steps recorded in full; later ones are watched for anomalies
DEFAULT_CAPTURE_MAX_MB = 256  # --capture stops past this size


@dataclass(frozen=True)
class Steps:
    """A union of half-open step ranges, parsed from ``"0:3,10,20:"``; ``None`` stop = no end."""

    ranges: tuple[tuple[int, int | None], ...] = ((0, None),)
    text: str = ""

    @classmethod
    def parse(cls, text: str | None) -> Steps:
        if text is None or not text.strip():
            text = DEFAULT_STEPS
        if text.strip() == "all":
            return cls(((0, None),), "all")
        ranges: list[tuple[int, int | None]] = []
        # an empty item ("5," or "0:3,,9") is a stray comma: left out, never step 0
        for part in filter(str.strip, text.split(",")):
            start_s, colon, stop_s = part.strip().partition(":")
            try:
                start = int(start_s) if start_s.strip() else 0
                stop = (int(stop_s) if stop_s.strip() else None) if colon else start + 1
            except ValueError:
                raise _unreadable_steps(text) from None
            if start < 0 or (stop is not None and stop <= start):
                raise HooktraceError(f"--steps {text!r}: {part.strip()!r} selects no step")
            ranges.append((start, stop))
        if not ranges:
            raise _unreadable_steps(text)
        return cls(tuple(sorted(ranges, key=lambda r: r[0])), text.strip())

    @classmethod
    def recorded(cls, text: object) -> Steps:
        """The steps a log header's ``steps`` says were recorded in full, its text kept: absent
        (or not a string), every step; a selection this hooktrace cannot read, none."""
        if not isinstance(text, str) or not text:
            return cls()
        try:
            return cls(cls.parse(text).ranges, text)
        except HooktraceError:
            return cls((), text)

    def __contains__(self, step: int) -> bool:
        return any(start <= step and (stop is None or step < stop) for start, stop in self.ranges)

    @property
    def last(self) -> int | None:
        """The last selected step, None when the selection has no end."""
        stops = [stop for _, stop in self.ranges]
        return None if None in stops else max(s for s in stops if s is not None) - 1


def selects(globs: Sequence[str], fqn: str, cls: str) -> bool:
    """Whether one of ``globs`` (``--include``, ``--exclude``, ``--capture``) names a module:
    matches its fqn (``layer4*``) or its class name (``Conv2d``: every one). Case counts:
    fqns are attribute names, classes CamelCase, so ``conv*`` is never ``Conv2d``."""
    return any(fnmatch.fnmatchcase(fqn, g) or fnmatch.fnmatchcase(cls, g) for g in globs)


def _unreadable_steps(text: str) -> HooktraceError:
    return HooktraceError(f"--steps {text!r}: expected steps like 0:3, 5 or 10: (comma-separated)")


@dataclass(frozen=True, kw_only=True)
class TraceOptions:
    include: Sequence[str] = ()  # fqn or class globs (``selects``); empty = every module
    exclude: Sequence[str] = ()
    steps: Steps = field(default_factory=lambda: Steps.parse(DEFAULT_STEPS))
    max_events: int = DEFAULT_MAX_EVENTS
    stats: bool = True  # gradient norms, NaN/Inf checks, parameter-gradient norms
    watch: bool = True  # after the recorded steps, write anomaly records (needs stats)
    break_on_nan: bool = False  # stop at the first module producing NaN/Inf (pdb, or raise)
    capture: Sequence[str] = ()  # fqn or class globs whose calls' tensors are saved beside the log
    capture_max_mb: int = DEFAULT_CAPTURE_MAX_MB  # stop capturing past this size
    strict: bool = False  # a failed log write is raised into the program instead of stopping
    ops: Sequence[str] = ()  # fqn globs whose calls' tensor operations are recorded (--ops)
    #: --probe: who may see whom, measured once per model on a copy (samples, positions, pads)
    probe: bool = False
    #: --time: each recorded call's forward and backward time (the ``call-times`` signal)
    time: bool = False
    #: how ``hooktrace run`` ran the program, "script" or "module" (-m); None: the Python API
    run: str | None = None

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise HooktraceError("--max-events must be at least 1")

    @property
    def filtered(self) -> bool:
        """Module calls may be left out by ``--include``/``--exclude``."""
        return bool(self.include or self.exclude)

    def matches(self, fqn: str, cls: str) -> bool:
        """Whether ``--include``/``--exclude`` trace the module ``fqn`` of class ``cls``."""
        if self.include and not selects(self.include, fqn, cls):
            return False
        return not selects(self.exclude, fqn, cls)

    @classmethod
    def from_flags(cls, *, include: Sequence[str], exclude: Sequence[str], steps: str | None,
                   max_events: int, stats: bool, watch: bool, break_on: str | None,
                   capture: Sequence[str], capture_max_mb: int, strict: bool,
                   ops: Sequence[str], probe: bool, time: bool,
                   run: str | None) -> TraceOptions:
        """The options as the user gives them (``hooktrace run``'s flags, ``hooktrace.trace``'s
        keywords): ``steps`` as text, ``break_on`` as ``"nan"`` or None."""
        if break_on not in (None, "nan"):
            raise HooktraceError(f"break_on={break_on!r}: only 'nan' is supported")
        return cls(include=tuple(include), exclude=tuple(exclude), steps=Steps.parse(steps),
                   max_events=max_events, stats=stats, watch=watch,
                   break_on_nan=break_on == "nan", capture=tuple(capture),
                   capture_max_mb=capture_max_mb, strict=strict, ops=tuple(ops), probe=probe,
                   time=time, run=run)

    @classmethod
    def from_header(cls, header: Header) -> TraceOptions:
        """What a log's header says was recorded (``to_header`` read back), tolerant of older
        logs: an option absent is what hooktrace did before it existed (every module, every
        step, statistics on, no watching after the recorded steps). ``capture_max_mb`` and
        ``strict`` say how the tracer behaved, not what it recorded: never written, defaults
        here."""
        options = header.options
        max_events = options.get("max_events")
        run = options.get("run")
        return cls(
            include=_globs(options.get("include")), exclude=_globs(options.get("exclude")),
            steps=Steps.recorded(options.get("steps")),
            max_events=max_events if isinstance(max_events, int) and max_events >= 1
            else DEFAULT_MAX_EVENTS,
            stats=bool(options.get("stats", True)), watch=bool(options.get("watch")),
            break_on_nan=options.get("break_on") == "nan", capture=_globs(options.get("capture")),
            ops=_globs(options.get("ops")), probe=bool(options.get("probe")),
            time=bool(options.get("time")), run=run if isinstance(run, str) else None)

    def to_header(self) -> dict[str, Any]:
        """The filters in force, for the log header (absent = everything recorded)."""
        out: dict[str, Any] = {"max_events": self.max_events, "stats": self.stats,
                               "watch": self.watch and self.stats}
        more = {"include": list(self.include), "exclude": list(self.exclude),
                "break_on": "nan" if self.break_on_nan else None, "capture": list(self.capture),
                "ops": list(self.ops), "probe": self.probe, "time": self.time, "run": self.run,
                "steps": self.steps.text}
        out.update((key, value) for key, value in more.items() if value)  # none at its default
        return out


#: the defaults, for ``hooktrace run``'s flags and ``hooktrace.trace``'s keywords to show
DEFAULTS = TraceOptions()


def _globs(value: object) -> tuple[str, ...]:
    """A header's list of fqn globs; anything else (absent) is none."""
    return tuple(str(g) for g in value) if isinstance(value, list | tuple) else ()

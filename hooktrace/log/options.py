"""What to record: fqn filters, the steps to record and a cap on events. Standard library only."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hooktrace.log.errors import HooktraceError

DEFAULT_MAX_EVENTS = 1_000_000  # ~200 MB of log; a safety cap, not a target
DEFAULT_STEPS = "0:10"  # steps recorded in full; later ones are watched for anomalies


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
        for part in text.split(","):
            start_s, colon, stop_s = part.strip().partition(":")
            try:
                start = int(start_s) if start_s.strip() else 0
                stop = (int(stop_s) if stop_s.strip() else None) if colon else start + 1
            except ValueError:
                raise HooktraceError(
                    f"--steps {text!r}: expected steps like 0:3, 5 or 10: (comma-separated)"
                ) from None
            if start < 0 or (stop is not None and stop <= start):
                raise HooktraceError(f"--steps {text!r}: {part.strip()!r} selects no step")
            ranges.append((start, stop))
        return cls(tuple(sorted(ranges, key=lambda r: r[0])), text.strip())

    def __contains__(self, step: int) -> bool:
        return any(start <= step and (stop is None or step < stop) for start, stop in self.ranges)

    @property
    def last(self) -> int | None:
        """The last selected step, None when the selection has no end."""
        stops = [stop for _, stop in self.ranges]
        return None if None in stops else max(s for s in stops if s is not None) - 1


@dataclass(frozen=True, kw_only=True)
class TraceOptions:
    include: Sequence[str] = ()  # fqn globs; empty = every module
    exclude: Sequence[str] = ()
    steps: Steps = field(default_factory=lambda: Steps.parse(DEFAULT_STEPS))
    max_events: int = DEFAULT_MAX_EVENTS
    stats: bool = True  # gradient norms, NaN/Inf checks, parameter-gradient norms
    watch: bool = True  # after the recorded steps, write anomaly records (needs stats)
    break_on_nan: bool = False  # stop at the first module producing NaN/Inf (pdb, or raise)
    capture: Sequence[str] = ()  # fqn globs whose calls' tensors are saved next to the log
    capture_max_mb: int = 256  # stop capturing past this size
    strict: bool = False  # a failed log write is raised into the program instead of stopping
    ops: Sequence[str] = ()  # fqn globs whose calls' tensor operations are recorded (--ops)
    #: --probe: who may see whom, measured once per model on a copy (samples, positions, pads)
    probe: bool = False
    #: how ``hooktrace run`` ran the program, "script" or "module" (-m); None: the Python API
    run: str | None = None

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise HooktraceError("--max-events must be at least 1")

    def matches(self, fqn: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(fqn, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(fqn, p) for p in self.exclude)

    def to_header(self) -> dict[str, Any]:
        """The filters in force, for the log header (absent = everything recorded)."""
        out: dict[str, Any] = {"max_events": self.max_events, "stats": self.stats,
                               "watch": self.watch and self.stats}
        if self.include:
            out["include"] = list(self.include)
        if self.exclude:
            out["exclude"] = list(self.exclude)
        if self.break_on_nan:
            out["break_on"] = "nan"
        if self.capture:
            out["capture"] = list(self.capture)
        if self.ops:
            out["ops"] = list(self.ops)
        if self.probe:
            out["probe"] = True
        if self.run:
            out["run"] = self.run
        if self.steps.text:
            out["steps"] = self.steps.text
        return out

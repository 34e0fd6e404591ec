"""The numbers of two matched calls side by side: when they agree within a tolerance, where
NaN/Inf appear in one run only, and how a divergence grows over the modules and steps after it.
Standard library only."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hooktrace.log.align import Event

_STATS = ("norm", "absmax")
_PROFILE_IN_STEP = 5  # modules shown for the step where the numbers first part
_PROFILE_STEPS = 4  # later steps shown (and the last one)
_INF = math.inf


class Found(NamedTuple):
    """A difference between the numbers of two matched calls; put in words only when shown."""

    kind: str  # value | nonfinite
    label: str  # "grad_output 0", "output 1"
    stat: str  # norm | absmax ("" for NaN/Inf)
    a: Sequence[float] | None  # A's statistic ([norm, absmax(, nan, inf)]), None: finite output
    b: Sequence[float] | None
    relative: float | None  # None: NaN/Inf in one run only

    def words(self) -> tuple[str, str, str]:
        """(what differs, A's value, B's value)."""
        if self.kind == "nonfinite":
            run = "B" if _finite(self.a) else "A"
            return (f"{self.label} has NaN/Inf in {run} only", _stat_text(self.a),
                    _stat_text(self.b))
        j = _STATS.index(self.stat)
        assert self.a is not None and self.b is not None
        return (f"{self.label} {self.stat} differs by {self.relative:.2g} (relative)",
                f"{self.a[j]:.4g}", f"{self.b[j]:.4g}")


@dataclass(frozen=True)
class Tolerance:
    """When the numbers of two matched calls agree, and the worst difference where they do not."""

    rtol: float
    atol: float

    def close(self, x: float, y: float) -> bool:
        """Within tolerance; NaN agrees with NaN and an infinity with itself."""
        d = abs(x - y)
        if d < _INF:  # both finite (a NaN or an infinity makes d NaN or inf)
            return d <= self.atol + self.rtol * max(abs(x), abs(y))
        return (math.isnan(x) and math.isnan(y)) or x == y

    def compare(self, a: Event, b: Event) -> Found | None:
        """The worst difference between the calls' numbers: NaN/Inf in one run only first,
        then the largest relative difference past the tolerance; None when they agree."""
        if a.phase == "forward":
            return None if a.nonfinite == b.nonfinite else _outputs(a.nonfinite, b.nonfinite)
        worst: Found | None = None
        for label, stats_a, stats_b in (("grad_output", a.out_stats, b.out_stats),
                                        ("grad_input", a.in_stats, b.in_stats)):
            if stats_a is None or stats_b is None or stats_a == stats_b:
                continue
            for i, (x, y) in enumerate(zip(stats_a, stats_b, strict=False)):
                if x is None or y is None or x == y:  # a gradient in one run only: shapes
                    continue
                found = self._gradient(f"{label} {i}", x, y)
                if found is not None and found.relative is None:
                    return found
                if found is not None and (worst is None
                                          or _size(found.relative) > _size(worst.relative)):
                    worst = found
        return worst

    def differing(self, pairs: Iterable[tuple[Event, Event]]) -> list[tuple[Event, Found]]:
        """The calls (A's events) among ``pairs`` whose numbers differ, and how."""
        return [(a, found) for a, b in pairs if (found := self.compare(a, b)) is not None]

    def _gradient(self, label: str, x: Sequence[float], y: Sequence[float]) -> Found | None:
        if len(x) == 2 and len(y) == 2:  # finite norms: the rule of ``close``, inlined
            # (this runs for every gradient that differs at all)
            rtol, atol = self.rtol, self.atol
            worst = None
            for j in (0, 1):
                v, w = x[j], y[j]
                d, scale = abs(v - w), max(abs(v), abs(w))
                if d < _INF and d > atol + rtol * scale and (
                        worst is None or d / scale > _size(worst.relative)):
                    worst = Found("value", label, _STATS[j], x, y, d / scale)
            return worst
        if _finite(x) != _finite(y):
            return Found("nonfinite", label, "", x, y, None)
        return None  # NaN/Inf in both runs


def relative(x: float, y: float) -> float:
    scale = max(abs(x), abs(y))
    return abs(x - y) / scale if scale else 0.0


def _finite(stat: Sequence[float] | None) -> bool:
    """A gradient statistic of finite numbers; None stands for a finite forward output."""
    return stat is None or (len(stat) == 2 and math.isfinite(stat[0]))


def _stat_text(stat: Sequence[float] | None) -> str:
    if stat is None:
        return "finite"
    if not _finite(stat):
        nan, inf = (int(stat[2]), int(stat[3])) if len(stat) == 4 else (0, 0)
        return f"{nan} NaN, {inf} Inf"
    return f"norm {stat[0]:.4g}, absmax {stat[1]:.4g}"


def _outputs(a: Sequence[Sequence[int]] | None, b: Sequence[Sequence[int]] | None
             ) -> Found | None:
    """Forward outputs with NaN/Inf in one run only (as [index, nan, inf])."""
    in_a = {int(o[0]): [0.0, 0.0, float(o[1]), float(o[2])] for o in a or ()}
    in_b = {int(o[0]): [0.0, 0.0, float(o[1]), float(o[2])] for o in b or ()}
    odd = sorted(in_a.keys() ^ in_b.keys())
    if not odd:
        return None
    return Found("nonfinite", f"output {odd[0]}", "", in_a.get(odd[0]), in_b.get(odd[0]), None)


def param_differences(a: dict[str, float | None], b: dict[str, float | None],
                      tolerance: Tolerance) -> list[tuple[str, float | None, float | None]]:
    """(fqn, A's norm, B's norm) where they differ; None: no gradient reached its parameters."""
    out: list[tuple[str, float | None, float | None]] = []
    for name in [*a, *(k for k in b if k not in a)]:
        x, y = a.get(name), b.get(name)
        if (x is None) != (y is None) or (
                x is not None and y is not None and not tolerance.close(x, y)):
            out.append((name, x, y))
    return out


def _entry(step: int, event: Event | None, rel: float | None) -> dict[str, Any]:
    if event is None:  # every call agrees
        return {"step": step, "module": None, "phase": None, "relative": 0.0}
    return {"step": step, "module": event.fqn, "phase": event.phase, "relative": rel}


def most_differing(found: Iterable[tuple[Event, Found]]) -> tuple[Event, float | None] | None:
    """The call whose numbers differ most, and by how much; the first one of NaN/Inf in one run
    only outranks all."""
    worst: tuple[Event, float | None] | None = None
    for a, f in found:
        if worst is None or _size(f.relative) > _size(worst[1]):
            worst = (a, f.relative)
    return worst


Worst = Callable[[], tuple[Event, float | None] | None]  # a step's largest difference, if any


@dataclass
class Growth:
    """How a divergence grows: the differing calls of the step where it starts, then the
    largest relative difference of the first few later steps and of the last one."""

    first: list[dict[str, Any]] = field(default_factory=list)
    later: list[dict[str, Any]] = field(default_factory=list)
    _start: int | None = None
    _last: tuple[int, Worst] | None = None  # the latest step past those shown in ``later``

    def wants(self, step: int) -> bool:
        """Whether the calls of ``step`` are wanted one by one: until the divergence has
        started, in its first step and in the later steps shown first. The others' largest
        difference is worked out only for the last of them (``defer``)."""
        return self._start is None or step == self._start or len(self.later) < _PROFILE_STEPS

    def step(self, step: int, found: list[tuple[Event, Found]]) -> None:
        """A step's calls whose numbers differ (none: every call agrees)."""
        if self._start is None and found:
            self._start = step
        if step == self._start:
            self.first += [_entry(step, a, f.relative) for a, f in found]
        elif self._start is not None:
            self.defer(step, lambda: most_differing(found))

    def defer(self, step: int, worst: Worst) -> None:
        """A later step, with the function that finds its largest difference."""
        if len(self.later) < _PROFILE_STEPS:
            self.later.append(_entry(step, *(worst() or (None, None))))
        else:
            self._last = (step, worst)

    def profile(self) -> list[dict[str, Any]]:
        first = self.first
        if len(first) > _PROFILE_IN_STEP:
            stride = (len(first) - 1) / (_PROFILE_IN_STEP - 1)
            first = [first[round(i * stride)] for i in range(_PROFILE_IN_STEP)]
        last = []
        if self._last is not None:
            step, worst = self._last
            last.append(_entry(step, *(worst() or (None, None))))
        return [*first, *self.later, *last]


def _size(rel: float | None) -> float:
    """A relative difference for ordering: NaN/Inf in one run only (None) is the largest."""
    return _INF if rel is None else rel

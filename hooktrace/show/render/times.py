"""``hooktrace show --sort time``: the calls of one recorded step that took longest, by their own
forward time (without their children's), from the ``call-times`` signal (``log/timing.py``).
"""

from __future__ import annotations

import os

from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.names import LogNames
from hooktrace.log.reader import LogReader
from hooktrace.log.timing import CallTime, times_by_seq
from hooktrace.log.words import columns, module_text, plural, printable
from hooktrace.show.render.text import Shown, matches


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"


def by_time(log: str | os.PathLike[str], step: int | None = None, model: str | None = None,
            limit: int = 100, module: str | None = None) -> Shown:
    """The table of ``step``'s calls (default: the first step with times) by own time, longest
    first, with their forward and backward times; of one model, or of the matching modules."""
    reader = LogReader(log)
    names = LogNames()
    forwards: dict[int, schema.ForwardEvent] = {}
    signals: list[schema.Signal] = []
    for r in reader:
        if isinstance(r, schema.ForwardEvent):
            forwards[r.seq] = r
        elif isinstance(r, schema.Signal):
            signals.append(r)
        else:
            names.take(r)
    times = times_by_seq(signals)
    steps = sorted({t.step for t in times.values()})
    if not steps:
        raise HooktraceError(f"{log} has no call times: trace it with hooktrace run --time "
                             "(its recorded steps hold them)")
    chosen = steps[0] if step is None else step
    if chosen not in steps:
        raise HooktraceError(f"step {chosen} has no call times; steps with them: "
                             f"{', '.join(map(str, steps))}")
    rows: list[tuple[CallTime, schema.ForwardEvent]] = []
    for t in times.values():
        f = forwards.get(t.seq)
        if t.step != chosen or f is None:
            continue
        name = names.models.get(f.model, str(f.model))
        if (model is None or name == model) and matches(f.fqn, names.classes.get(
                (f.model, f.fqn), "?"), module):
            rows.append((t, f))
    rows.sort(key=lambda tf: (-tf[0].own, tf[0].seq))
    shown = rows if limit <= 0 else rows[:limit]
    title = ["own ms", "forward ms", "backward ms", "seq", "model", "call", "fqn", "class"]
    table = [[_ms(t.own), _ms(t.forward), _ms(t.backward), str(f.seq),
              printable(names.models.get(f.model, str(f.model))), str(f.call),
              module_text(f.fqn), printable(names.classes.get((f.model, f.fqn), "?"))]
             for t, f in shown]
    total = sum(t.own for t, _ in rows)
    lines = [f"step {chosen}: {plural(len(rows), 'call')} by own forward time (without their "
             f"children's), {_ms(total)} ms in all", "", *columns([title, *table])]
    if len(shown) < len(rows):
        lines.append(f"... {plural(len(rows) - len(shown), 'more call')}: --limit 0 shows all")
    return Shown("\n".join(lines) + "\n", reader.warnings)

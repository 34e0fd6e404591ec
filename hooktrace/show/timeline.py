"""``hooktrace export --format trace``: the recorded steps on a time axis, as a Trace Event Format
file (JSON) that Perfetto (ui.perfetto.dev, its trace processor) and Chromium's trace viewer open.

Each rank is a process; each model two threads, its forwards and its backwards. A recorded call
is a complete (``X``) span, nested by time (a call inside its parent's span); its arguments are
its class, step, call, shapes, its own time and, for a backward, its gradients' norms. An
optimizer step is an instant event at the end of the pass it came after; a finding of ``check``
an instant at its module's first call in its step (else that step's start). Times come from
the ``call-times`` signal (``log/timing.py``, ``run --time``): a log without it is an error.
Standard library and orjson only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

import orjson

from hooktrace.check.checklog import check_readers
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError
from hooktrace.log.gradstat import norm
from hooktrace.log.names import LogNames
from hooktrace.log.reader import LogReader
from hooktrace.log.schema import SignalKind
from hooktrace.log.timing import CallTime, call_times
from hooktrace.log.words import fqn_text, shape_text

#: the first key of the file: marks it as hooktrace's (a default output is replaced only then)
MARK = b'{"otherData":{"writer":"hooktrace'


def _shapes(shapes: Sequence[Any]) -> str:
    return ", ".join("-" if s is None else shape_text(s) for s in shapes)


class _Rank:
    """One log's spans and instants; ``origin`` the clock's smallest reading in it (us)."""

    def __init__(self, reader: LogReader) -> None:
        self.rank = reader.header.rank
        self.names = LogNames()
        self.times: dict[int, CallTime] = {}
        self.spans: list[dict[str, Any]] = []
        self.ends: dict[int, float] = {}  # step -> its pass's end on the clock
        self.first: dict[tuple[int, str, int], float] = {}  # (model, fqn, step) -> first start
        self.optimizer_steps: list[tuple[str, list[Any]]] = []
        forwards: list[schema.ForwardEvent] = []
        backwards: list[schema.BackwardEvent] = []
        for r in reader:
            if isinstance(r, schema.ForwardEvent):
                forwards.append(r)
            elif isinstance(r, schema.BackwardEvent):
                backwards.append(r)
            elif isinstance(r, schema.Signal):
                self._signal(r)
            else:
                self.names.take(r)
        for f in forwards:
            self._forward(f)
        for b in backwards:
            self._backward(b)

    def _signal(self, s: schema.Signal) -> None:
        if s.kind == SignalKind.CALL_TIMES:
            self.times.update((t.seq, t) for t in call_times(s))
            origin, end = s.detail.get("origin"), s.detail.get("end")
            if isinstance(origin, (int, float)) and isinstance(end, (int, float)):
                self.ends[s.step] = max(self.ends.get(s.step, 0.0), origin + end)
        elif s.kind == SignalKind.OPTIMIZER_STEPS and isinstance(s.detail.get("after"), list):
            self.optimizer_steps.append((str(s.detail.get("optimizer", "optimizer")),
                                         s.detail["after"]))

    def _span(self, model: int, phase: int, name: str, ts: float, dur: float,
              args: dict[str, Any]) -> None:
        self.spans.append({"name": name, "ph": "X", "pid": self.rank, "tid": 2 * model + phase,
                           "ts": ts, "dur": max(dur, 0.0), "args": args})

    def _forward(self, f: schema.ForwardEvent) -> None:
        t = self.times.get(f.seq)
        if t is None:
            return
        key = (f.model, f.fqn, f.step)
        self.first[key] = min(self.first.get(key, t.start), t.start)
        self._span(f.model, 0, fqn_text(f.fqn), t.start, t.forward, {
            "class": self.names.classes.get((f.model, f.fqn), "?"), "step": f.step,
            "call": f.call, "seq": f.seq, "own_us": t.own, "inputs": _shapes(f.input_shapes),
            "outputs": _shapes(f.output_shapes), "no_grad": f.no_grad,
            "recompute": f.recompute})

    def _backward(self, b: schema.BackwardEvent) -> None:
        t = self.times.get(b.fwd)
        if t is None or t.backward_start is None or t.backward is None:
            return
        self._span(b.model, 1, fqn_text(b.fqn), t.backward_start, t.backward, {
            "class": self.names.classes.get((b.model, b.fqn), "?"), "step": b.step,
            "call": b.call, "seq": b.seq, "forward_seq": b.fwd,
            "grad_output": _shapes(b.grad_output_shapes),
            "grad_input": _shapes(b.grad_input_shapes),
            "grad_output_norm": norm(b.grad_output_stats),
            "grad_input_norm": norm(b.grad_input_stats)})

    def instants(self, findings: Sequence[Any]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for optimizer, after in self.optimizer_steps:
            for step in after:
                if step in self.ends:
                    found.append({"name": f"{optimizer}.step()", "ph": "i", "s": "p",
                                  "pid": self.rank, "tid": 0, "ts": self.ends[step],
                                  "args": {"after_step": step}})
        by_name = {name: model for model, name in self.names.models.items()}
        for f in findings:
            model = by_name.get(f.model, 0)
            ts = self.first.get((model, f.module, f.step))
            if ts is None:
                starts = [t.start for t in self.times.values() if t.step == f.step]
                ts = min(starts) if starts else None
            if ts is not None and (f.ranks is None or self.rank in f.ranks):
                found.append({"name": f"{f.cause}: {fqn_text(f.module)}", "ph": "i", "s": "t",
                              "pid": self.rank, "tid": 2 * model, "ts": ts,
                              "args": {"severity": f.severity, "message": f.message,
                                       "hint": f.hint}})
        return found

    def threads(self) -> list[dict[str, Any]]:
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank}"}}]
        for model, name in sorted(self.names.models.items()):
            for phase, what in enumerate(("forward", "backward")):
                meta.append({"name": "thread_name", "ph": "M", "pid": self.rank,
                             "tid": 2 * model + phase, "args": {"name": f"{name} {what}"}})
        return meta


def nested(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``spans`` by thread and start, each cut to end inside the span it starts in: a viewer
    draws only spans that nest (a backward's end is its inputs' last gradient, which a
    branch beside it may come after; rounding to 1 us)."""
    spans.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    ends: list[tuple[Any, Any, float]] = []  # (pid, tid, end) of the spans open
    for e in spans:
        while ends and (ends[-1][:2] != (e["pid"], e["tid"]) or e["ts"] >= ends[-1][2]):
            ends.pop()
        if ends and e["ts"] + e["dur"] > ends[-1][2]:
            e["dur"] = ends[-1][2] - e["ts"]
        e["dur"] = round(e["dur"], 1)
        ends.append((e["pid"], e["tid"], e["ts"] + e["dur"]))
    return spans


def write_trace(out: IO[str], readers: Sequence[LogReader]) -> int:
    """Write the trace of ``readers`` (one log, or the ranks of one run) into ``out``; the
    number of spans and instants written."""
    findings = check_readers(readers).findings  # TODO(issue 46): one read for both
    ranks = [_Rank(LogReader(reader.path)) for reader in readers]
    if not any(r.times for r in ranks):
        raise HooktraceError(f"{readers[0].path} has no call times: trace it with hooktrace run "
                             "--time (its recorded steps hold them)")
    events = nested([s for r in ranks for s in r.spans])
    events += [i for r in ranks for i in r.instants(findings)]
    zero = min((e["ts"] for e in events), default=0.0)
    for e in events:
        e["ts"] = round(e["ts"] - zero, 1)  # the run's first call at 0
    meta = [m for r in ranks for m in r.threads()]
    out.write(orjson.dumps({"otherData": {"writer": "hooktrace", "clock": "host monotonic, us"},
                            "displayTimeUnit": "ms", "traceEvents": meta + events},
                           option=orjson.OPT_APPEND_NEWLINE).decode("utf-8"))
    return len(events)

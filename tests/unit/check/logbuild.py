"""Hand-built logs for the check tests, written with the log's own writer: a model's modules,
each step's calls (forward order, a parent after its children) with the gradient norms their
backward received and passed back, and the records around them (params, signals, end).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import Finding, Thresholds
from hooktrace.log import schema
from hooktrace.log.writer import LogWriter

SAME = "same"  # a call's g_in: what it received (a gain of 1)
NAN = math.nan

#: a plain model: two Linears around a ReLU, its root calling them in turn
CHAIN: list[tuple[str, str, int]] = [
    ("", "Net", 0), ("fc1", "Linear", 40), ("act", "ReLU", 0), ("fc2", "Linear", 18)]


@dataclass
class C:
    """One module call of a step. ``g_out``: the norm of the gradient its backward received
    (None: its backward never arrives); ``g_in``: what it passed back (``SAME``: as much,
    None: no gradient flowed to its input)."""

    name: str
    g_out: float | None = 0.5
    g_in: float | str | None = SAME
    no_grad: bool = False
    eval_mode: bool = False  # its module in eval mode (model.eval())
    nonfinite: list[list[int]] | None = None  # forward output NaN/Inf: [index, nan, inf]
    lost: list[int] | None = None  # inputs that needed a gradient and got none
    out_stats: list[list[float] | None] | None = None  # explicit statistics, NaN counts
    in_stats: list[list[float] | None] | None = None
    shape: list[int] = field(default_factory=lambda: [4, 8])
    dtype: str = "float32"
    model: int = 0  # the index of its model: 0 is ``write_log``'s ``modules``, then ``others``
    made_no_history: bool = False  # something without autograd history went into its outputs


def chain(**over: C) -> list[C]:
    """One step of ``CHAIN``: fc1, act, fc2, then the root; ``over`` replaces a call by name
    (``root`` for the root)."""
    calls = [C("fc1", g_in=None), C("act"), C("fc2"), C("")]
    return [over.get(c.name or "root", c) for c in calls]


def header(**options: Any) -> schema.Header:
    base = {"max_events": 1000000, "stats": True, "watch": True, "run": "script",
            "steps": "0:10"}
    return schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0", argv=["train.py"],
                         pid=1, options={**base, **options})


def _stats(norm: float | None) -> list[float] | None:
    if norm is None:
        return None
    if math.isnan(norm):
        return [NAN, NAN, 32, 0]
    return [norm, norm / 2]


def _module(spec: tuple[Any, ...], model: int) -> schema.Module:
    """(fqn, class, params[, trainable[, aliases]])"""
    name, cls, params = spec[:3]
    trainable = spec[3] if len(spec) > 3 else params
    return schema.Module(model=model, fqn=name, cls=cls, params=params, trainable=trainable,
                         aliases=spec[4] if len(spec) > 4 else None)


def write_log(path: Path, steps: Sequence[Sequence[C]], *,
              modules: Sequence[tuple[Any, ...]] = tuple(CHAIN), model: str = "net",
              params: Mapping[int, Mapping[str, float | None]] | None = None,
              signals: Iterable[schema.Signal] = (), optimizer: bool = True,
              end: str | None = "ok", error: dict[str, Any] | None = None,
              exit_code: int | None = None, unfinished: bool = False,
              extra: Iterable[Any] = (), head: schema.Header | None = None,
              end_steps: int | None = None, sources: bool = False,
              others: Sequence[tuple[str, Sequence[tuple[Any, ...]]]] = ()) -> Path:
    """Write a log of one model (``modules``: (fqn, class, params[, trainable])) running
    ``steps``. Each step: forward events in order, backward events in reverse for the calls
    with a ``g_out``, a params record (default: each trainable module's ``g_out``, None where
    no backward came; ``params`` overrides per step), the step record, and the ``signals`` of
    that step. ``optimizer``: an ``optimizers`` signal holding every trainable module after
    step 0. ``unfinished``: the last step's backward pass never ends (no params, no step
    record). ``extra``: records written before the end record (anomalies of watched steps).
    ``end``: the end status, None for no end record. ``others``: more models, (name,
    modules) each, called by ``C(model=1)`` and on; no optimizer holds them."""
    models = [(model, modules), *others]
    mods = [_module(m, i) for i, (_, specs) in enumerate(models) for m in specs]
    trainable = [m.fqn for m in mods if m.trainable and m.model == 0]
    writer = LogWriter(path)
    writer.write(head or header())
    for i, (name, specs) in enumerate(models):
        writer.write(schema.Model(model=i, name=name, cls=_module(specs[0], i).cls))
    for m in mods:
        writer.write(m)
    if sources:
        writer.write(schema.Source(cls=mods[0].cls, file="train.py", line=10))
    pending = sorted(signals, key=lambda s: s.step)
    if optimizer and steps:
        pending.append(schema.Signal(step=0, model=0, fqn="", kind="optimizers",
                                     detail={"held": trainable, "not_held": []}))
        pending.sort(key=lambda s: s.step)
    seq = events = 0
    for step, calls in enumerate(steps):
        seq, backs = _write_step(writer, step, calls, seq)
        events += len(calls) + backs
        if unfinished and step == len(steps) - 1:
            break
        for i in range(len(models)):
            _write_params(writer, step, i, calls, mods, (params or {}).get(step, {}) if i == 0
                          else {})
        writer.write(schema.Step(step=step, forward=len(calls), backward=backs))
        while pending and pending[0].step <= step:
            writer.write(pending.pop(0))
    for record in [*pending, *extra]:
        writer.write(record)
    if end is not None:
        done = len(steps) - (1 if unfinished else 0)
        writer.write(schema.End(
            status=end, events=events, steps=done if end_steps is None else end_steps,
            exit_code=(0 if end == "ok" else 1) if exit_code is None else exit_code,
            error=error))
    writer.close()
    return path


def _write_step(writer: LogWriter, step: int, calls: Sequence[C], seq: int) -> tuple[int, int]:
    """A step's forward events, then the backward events of its calls that have a ``g_out``,
    in reverse; the last seq and the number of backward events."""
    counts: dict[tuple[int, str], int] = {}
    fwd: list[tuple[int, int, C]] = []
    for c in calls:
        seq += 1
        index = counts[(c.model, c.name)] = counts.get((c.model, c.name), -1) + 1
        fwd.append((seq, index, c))
        writer.write(schema.ForwardEvent(
            seq=seq, step=step, model=c.model, fqn=c.name, call=index, input_shapes=[[4, 8]],
            input_dtypes=["float32"], output_shapes=[c.shape], output_dtypes=[c.dtype],
            no_grad=c.no_grad, output_nonfinite=c.nonfinite, eval_mode=c.eval_mode,
            made_no_history=c.made_no_history))
    backs = 0
    for fseq, index, c in reversed(fwd):
        if c.g_out is None or c.no_grad:
            continue
        seq += 1
        backs += 1
        g_in = c.g_out if c.g_in == SAME else c.g_in
        assert not isinstance(g_in, str)
        writer.write(schema.BackwardEvent(
            seq=seq, step=step, model=c.model, fqn=c.name, call=index, fwd=fseq,
            grad_input_len=1, grad_output_len=1,
            grad_input_shapes=[None if g_in is None else c.shape], grad_output_shapes=[c.shape],
            grad_input_stats=c.in_stats or [_stats(g_in)],
            grad_output_stats=c.out_stats or [_stats(c.g_out)], lost=c.lost))
    return seq, backs


def _write_params(writer: LogWriter, step: int, model: int, calls: Sequence[C],
                  mods: Sequence[schema.Module], given: Mapping[str, float | None]) -> None:
    """The params record of ``model`` at ``step``: each trainable module it called, the
    ``g_out`` of that call (None: no backward), ``given`` over them; none where no backward
    reached the model and nothing is given."""
    called = {c.name: c for c in calls if not c.no_grad and c.model == model}
    norms: dict[str, float | None] = {m.fqn: called[m.fqn].g_out for m in mods
                                      if m.model == model and m.trainable and m.fqn in called}
    norms.update(given)
    if given or (norms and any(c.g_out is not None for c in called.values())):
        writer.write(schema.ParamGrads(step=step, model=model, grad_norm=norms))


def healthy(n: int = 3) -> list[list[C]]:
    """``n`` steps of ``CHAIN`` where every call gets and passes back a gradient."""
    return [chain() for _ in range(n)]


def signal(kind: str, step: int = 0, name: str = "", *, model: int = 0, **detail: Any
           ) -> schema.Signal:
    return schema.Signal(step=step, model=model, fqn=name, kind=kind, detail=detail)


def findings(path: Path, step: int | None = None, thresholds: Thresholds | None = None
             ) -> list[Finding]:
    return run_checks(path, step, thresholds).findings


def summary(path: Path, step: int | None = None, thresholds: Thresholds | None = None
            ) -> list[tuple[str, str, str, int | None]]:
    """(kind, severity, module, step) of each finding, in the report's order."""
    return [(f.cause, f.severity, f.module, f.step) for f in findings(path, step, thresholds)]

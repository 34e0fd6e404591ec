"""One streaming pass over a log into what the checks need: per-module aggregates.

Memory grows with the number of modules and the events of a few steps (forward calls wait at
most two steps for their backward), not with the length of the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hooktrace import schema
from hooktrace.logio import LogReader


@dataclass
class ModuleStats:
    model: int
    name: str
    cls: str
    params: int = 0
    trainable: int = 0
    first_seq: int | None = None  # first forward call: execution order
    calls: int = 0
    max_calls_per_step: int = 0
    grad_calls: dict[int, int] = field(default_factory=dict)  # step -> calls with grad on
    no_grad_steps: set[int] = field(default_factory=set)
    backward_for: dict[int, int] = field(default_factory=dict)  # forward's step -> backwards


@dataclass
class Nonfinite:
    step: int
    model: int
    name: str
    evidence: dict[str, Any]


@dataclass
class Collected:
    """What the checks need from a log, gathered in one streaming pass."""

    header: schema.Header
    models: dict[int, str] = field(default_factory=dict)
    modules: dict[tuple[int, str], ModuleStats] = field(default_factory=dict)
    backward_steps: set[int] = field(default_factory=set)
    first_forward_nonfinite: Nonfinite | None = None
    forward_nonfinite_steps: set[int] = field(default_factory=set)
    first_backward_nonfinite: Nonfinite | None = None
    backward_nonfinite_steps: set[int] = field(default_factory=set)
    param_norms: dict[int, dict[tuple[int, str], float | None]] = field(default_factory=dict)
    # per step: activation-gradient norms (grad_output) of modules with parameters, backward order
    profiles: dict[int, list[tuple[int, str, float]]] = field(default_factory=dict)
    # the first step whose backward does not run the calls in the reverse of their forward
    # order: (step, model, fqn of the first call out of place)
    order_mismatch: tuple[int, int, str] | None = None
    steps_seen: set[int] = field(default_factory=set)
    lost_gradient: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # watched
    warnings: list[str] = field(default_factory=list)
    end: schema.End | None = None

    def model_name(self, model: int) -> str:
        return self.models.get(model, str(model))


def _finite(stat: list[float] | None) -> bool:
    return stat is None or math.isfinite(stat[0])


def _nonfinite_counts(stats: Iterable[list[float] | None]) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(stats):
        if s is not None and not math.isfinite(s[0]):
            out.append({"index": i, "nan": int(s[2]) if len(s) > 2 else None,
                        "inf": int(s[3]) if len(s) > 3 else None})
    return out


class _Collector:
    def __init__(self, reader: LogReader, step: int | None) -> None:
        self.c = Collected(header=reader.header)
        self._only = step
        self._fwd_step: dict[int, int] = {}  # forward seq -> its step, for recent steps only
        self._calls_this_step: dict[tuple[int, str], int] = {}
        self._step = -1
        self._forward_seqs: dict[int, tuple[int, str]] = {}  # this step's calls, in order
        self._backward_fwds: list[int] = []  # the forward seq of this step's backward events

    def feed(self, records: Iterator[schema.Record]) -> Collected:
        for r in records:
            if isinstance(r, schema.ForwardEvent):
                self._forward(r)
            elif isinstance(r, schema.BackwardEvent):
                self._backward(r)
            elif isinstance(r, schema.Module):
                self.c.modules.setdefault((r.model, r.name), ModuleStats(
                    r.model, r.name, r.cls, r.params, r.trainable))
            elif isinstance(r, schema.Model):
                self.c.models[r.model] = r.name
            elif isinstance(r, schema.ParamGrads):
                if self._wanted(r.step):
                    self._param_grads(r)
            elif isinstance(r, schema.Anomaly):
                if self._wanted(r.step):
                    self._anomaly(r)
            elif isinstance(r, schema.End):
                self.c.end = r
        self._compare_orders()
        return self.c

    def _compare_orders(self) -> None:
        """Does the step's backward run its calls in the reverse of their forward order?"""
        if self.c.order_mismatch is None and self._backward_fwds:
            backward = [f for f in self._backward_fwds if f in self._forward_seqs]
            mirrored = sorted(set(backward), reverse=True)  # seqs grow in forward order
            for got, expected in zip(backward, mirrored, strict=False):
                if got != expected:
                    model, name = self._forward_seqs[got]
                    self.c.order_mismatch = (self._step, model, name)
                    break
        self._forward_seqs.clear()
        self._backward_fwds.clear()

    def _anomaly(self, r: schema.Anomaly) -> None:
        """A watched step's record: the same findings as from events, without the events."""
        found = Nonfinite(r.step, r.model, r.name, {"call": r.call, **r.detail})
        if r.kind == "nonfinite-forward":
            self.c.forward_nonfinite_steps.add(r.step)
            first = self.c.first_forward_nonfinite
            if first is None or r.step < first.step:
                self.c.first_forward_nonfinite = found
        elif r.kind == "nonfinite-backward":
            self.c.backward_nonfinite_steps.add(r.step)
            first = self.c.first_backward_nonfinite
            if first is None or r.step < first.step:
                self.c.first_backward_nonfinite = found
        elif r.kind == "no-grad":
            self.c.lost_gradient.setdefault((r.model, r.name), []).append(r.step)

    def _wanted(self, step: int) -> bool:
        return self._only is None or step == self._only

    def _module(self, model: int, name: str) -> ModuleStats:
        key = (model, name)
        m = self.c.modules.get(key)
        if m is None:  # a module made inside forward: no module record
            m = self.c.modules[key] = ModuleStats(model, name, "?")
        return m

    def _new_step(self, step: int) -> None:
        if step != self._step:
            self._compare_orders()
            self._step = step
            self._calls_this_step.clear()
            # a forward call is paired within a step or two (a GAN's generator); forget older ones
            for seq in [s for s, st in self._fwd_step.items() if st < step - 2]:
                del self._fwd_step[seq]

    def _forward(self, e: schema.ForwardEvent) -> None:
        self._new_step(e.step)
        self._fwd_step[e.seq] = e.step
        self.c.steps_seen.add(e.step)
        if not self._wanted(e.step) or e.recompute:
            return
        m = self._module(e.model, e.name)
        if m.first_seq is None:
            m.first_seq = e.seq
        m.calls += 1
        key = (e.model, e.name)
        n = self._calls_this_step[key] = self._calls_this_step.get(key, 0) + 1
        m.max_calls_per_step = max(m.max_calls_per_step, n)
        if e.no_grad:
            m.no_grad_steps.add(e.step)
        else:
            m.grad_calls[e.step] = m.grad_calls.get(e.step, 0) + 1
        self._forward_seqs[e.seq] = key
        if e.output_nonfinite:
            self.c.forward_nonfinite_steps.add(e.step)
            if self.c.first_forward_nonfinite is None:
                self.c.first_forward_nonfinite = Nonfinite(e.step, e.model, e.name, {
                    "call": e.call, "outputs": [
                        {"index": i, "shape": e.output_shapes[i] if i < len(e.output_shapes)
                         else None, "nan": nan, "inf": inf}
                        for i, nan, inf in e.output_nonfinite],
                })

    def _backward(self, e: schema.BackwardEvent) -> None:
        if not self._wanted(e.step):
            return
        self.c.backward_steps.add(e.step)
        fwd_step = self._fwd_step.get(e.fwd, e.step)
        m = self._module(e.model, e.name)
        m.backward_for[fwd_step] = m.backward_for.get(fwd_step, 0) + 1
        self._backward_fwds.append(e.fwd)
        outs = e.grad_output_stats or []
        if m.trainable and outs and outs[0] is not None and math.isfinite(outs[0][0]):
            self.c.profiles.setdefault(e.step, []).append((e.model, e.name, outs[0][0]))
        received = not all(_finite(s) for s in outs)
        produced = not received and not all(_finite(s) for s in e.grad_input_stats or [])
        if received or produced:
            self.c.backward_nonfinite_steps.add(e.step)
            if self.c.first_backward_nonfinite is None:
                self.c.first_backward_nonfinite = Nonfinite(e.step, e.model, e.name, {
                    "call": e.call, "produced": produced,
                    "grad_output": _nonfinite_counts(outs),
                    "grad_input": _nonfinite_counts(e.grad_input_stats or []),
                })

    def _param_grads(self, r: schema.ParamGrads) -> None:
        norms = self.c.param_norms.setdefault(r.step, {})
        for name, norm in r.grad_norm.items():
            norms[(r.model, name)] = norm
        if any(v is not None and not math.isfinite(v) for v in r.grad_norm.values()):
            self.c.backward_nonfinite_steps.add(r.step)
            if self.c.first_backward_nonfinite is None:
                name = next(k for k, v in r.grad_norm.items()
                            if v is not None and not math.isfinite(v))
                self.c.first_backward_nonfinite = Nonfinite(r.step, r.model, name, {
                    "produced": True, "parameter_grad_norm": str(r.grad_norm[name])})


def collect(path: str | os.PathLike[str], step: int | None = None) -> Collected:
    reader = LogReader(path)
    collected = _Collector(reader, step).feed(iter(reader))
    collected.warnings.extend(reader.warnings)
    return collected

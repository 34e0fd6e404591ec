"""One streaming pass over a log into what the checks need: per-module aggregates.

Memory grows with the number of modules and the events of a few steps (forward calls wait at
most two steps for their backward); per step it keeps the profile and parameter norms, and which
modules ran and got a backward, as one shared set per distinct set of modules.

Speed: a step's plain events (``Decoder.forward``: no flag, finite statistics) go into lists of
module indices, counted when the step ends. A training loop repeats one step, so its forward calls
are counted once per distinct sequence of calls (a ``_Pattern``), not once per event.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hooktrace import flow, schema, wire
from hooktrace.logio import LogReader

ModuleKey = tuple[int, str]  # (model, fqn)
Keys = frozenset[ModuleKey]


@dataclass
class ModuleStats:
    model: int
    name: str
    cls: str
    params: int = 0
    trainable: int = 0
    first_seq: int | None = None  # first forward call: execution order
    calls: int = 0
    max_calls_per_step: int = 0  # with gradient recording on


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
    modules: dict[ModuleKey, ModuleStats] = field(default_factory=dict)
    backward_steps: set[int] = field(default_factory=set)
    # per step: the modules it called with gradient recording on, and under no_grad; per step
    # of a forward call, the modules whose calls of that step got a backward
    grad: dict[int, Keys] = field(default_factory=dict)
    no_grad: dict[int, Keys] = field(default_factory=dict)
    backward: dict[int, Keys] = field(default_factory=dict)
    first_forward_nonfinite: Nonfinite | None = None
    forward_nonfinite_steps: set[int] = field(default_factory=set)
    first_backward_nonfinite: Nonfinite | None = None
    backward_nonfinite_steps: set[int] = field(default_factory=set)
    # per step: (model, fqns, parameter-gradient norms) of each params record, in file order; the
    # fqns are a tuple shared by the records of the same modules
    param_norms: dict[int, list[tuple[int, tuple[str, ...], tuple[float | None, ...]]]] = field(
        default_factory=dict)
    # per step: activation-gradient norms (grad_output) of modules with parameters, in backward
    # order, as (modules, norms): tuples, the first shared by the steps with the same modules
    profiles: dict[int, tuple[tuple[ModuleKey, ...], tuple[float, ...]]] = field(
        default_factory=dict)
    # the first step whose backward does not run the calls in the reverse of their forward
    # order: (step, model, fqn of the first call out of place)
    order_mismatch: tuple[int, int, str] | None = None
    steps_seen: set[int] = field(default_factory=set)
    lost_gradient: dict[ModuleKey, list[int]] = field(default_factory=dict)  # watched
    warnings: list[str] = field(default_factory=list)
    end: schema.End | None = None
    # the calls of the first recorded steps, each with its backward's gradient norms
    calls: list[flow.Call] = field(default_factory=list)
    # a backward pass that never ended (it raised): its step, and the module of its last
    # backward event, whose backward was running
    unfinished: tuple[int, ModuleKey] | None = None
    signals: list[schema.Signal] = field(default_factory=list)  # in file order
    sources: dict[str, str] = field(default_factory=dict)  # class -> "file:line" of forward

    def model_name(self, model: int) -> str:
        return self.models.get(model, str(model))

    def label(self, model: int, name: str) -> str:
        """A module as findings name it: ``layer1.0 (BasicBlock)``, ``(root)`` for the root."""
        m = self.modules.get((model, name))
        return f"{name or '(root)'} ({m.cls})" if m and m.cls != "?" else (name or "(root)")


def _finite(stat: list[float] | None) -> bool:
    return stat is None or math.isfinite(stat[0])


def _nonfinite_counts(stats: Iterable[list[float] | None]) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(stats):
        if s is not None and not math.isfinite(s[0]):
            out.append({"index": i, "nan": int(s[2]) if len(s) > 2 else None,
                        "inf": int(s[3]) if len(s) > 3 else None})
    return out


Indices = frozenset[int]  # of module keys (_Collector._keys): cheap to hash, unlike keys


@dataclass(slots=True)
class _Pattern:
    """One step's forward calls, counted; ``runs``: the steps that made exactly these calls."""

    calls: dict[int, int]
    grad_calls: dict[int, int]  # the calls with gradient recording on (not a validation pass)
    grad: Indices
    no_grad: Indices
    runs: int = 0


_PATTERNS = 1000  # counted sequences of calls kept; a model whose steps all differ cycles them


class _Collector:
    def __init__(self, reader: LogReader, step: int | None) -> None:
        self.c = Collected(header=reader.header)
        self._only = step
        self._decoder = wire.Decoder()
        self._keys: list[ModuleKey] = []  # a module's index -> its key
        self._index: dict[ModuleKey, int] = {}
        self._ids: dict[int, int] = {}  # the log's module id -> index (refilled: ids may move)
        self._trainable: set[int] = set()
        self._fwd_step: dict[int, int] = {}  # forward seq -> its step, for recent steps only
        self._recent: list[tuple[int, list[int]]] = []  # (step, its forward seqs) in _fwd_step
        self._step: int | None = None  # of the forward calls since it last changed, here:
        self._seqs: list[int] = []  # every forward's seq
        self._calls: list[int | None] = []  # wanted: its module's index; None for a recompute
        self._no_grad: list[int] = []  # the calls under no_grad
        self._recomputed = False  # a None in _calls
        self._synced = 0  # how many of _seqs are in _fwd_step
        self._bstep: int | None = None  # of the backward events in these lists:
        self._bcalls: list[int] = []
        self._bfwds: list[int] = []
        self._profiled: list[ModuleKey] = []  # the profile of the step of _bstep, so far
        self._norms: list[float] = []
        self._backward_fwds: list[int] = []  # the forward seq of this step's backward events
        self._patterns: dict[tuple[Any, ...], _Pattern] = {}
        self._sets: dict[Indices, Indices] = {}  # one object per distinct set
        self._shared: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # of profiles and params
        self._grad: dict[int, Indices] = {}  # the sets of Collected, as indices
        self._no_grad_steps: dict[int, Indices] = {}
        self._backed: dict[int, Indices] = {}
        # the calls of the steps judged call by call (flow.STEPS), by forward seq; and by
        # (step, module index, call index), for the backward of a recomputed call
        self._flow: dict[int, flow.Call] = {}
        self._flow_calls: dict[tuple[int, int, int], flow.Call] = {}
        self._flow_steps: set[int] = set()
        self._flowing = False  # the forward calls' step is judged
        self._last_backward: tuple[int, int] | None = None  # (step, module index)
        self._closed: set[int] = set()  # steps with a step record

    def feed(self, reader: LogReader) -> Collected:
        for item in reader.scan(self._decoder):
            if type(item) is list:
                self._plain(item)
            else:
                self._record(item)
        self._forward_step(None)
        self._backward_step(None)
        self._add_patterns()
        self._finish()
        return self.c

    def _plain(self, events: list[dict[str, Any]]) -> None:
        """Plain events of one type: into the lists of their step (tight loops: most of a log
        is these)."""
        ids, keys, only = self._ids, self._keys, self._only
        if events[0]["type"] == "forward":
            seqs, calls = self._seqs, self._calls
            if self._bcalls:
                self._close_backward()
            for d in events:
                if (step := d["step"]) != self._step:
                    self._forward_step(step)
                seqs.append(d["seq"])
                if only is None or step == only:
                    calls.append(index := ids[m] if (m := d["module"]) in ids else self._id(m))
                    if self._flowing:
                        self._flow_call(step, d["seq"], index, d["call"], True)
            return
        bcalls, bfwds, trainable = self._bcalls, self._bfwds, self._trainable
        profiled, norms, judged = self._profiled, self._norms, self._flow
        for d in events:
            if (step := d["step"]) != self._bstep:
                self._backward_step(step)
            if only is None or step == only:
                index = ids[m] if (m := d["module"]) in ids else self._id(m)
                bcalls.append(index)
                bfwds.append(fwd := d["fwd"])
                if judged and (call := judged.get(fwd)) is not None:
                    call.gradients(d.get("out_stats"), d.get("in_stats"))
                if index in trainable:
                    outs = d.get("out_stats")
                    if outs and (stat := outs[0]) is not None:  # plain: finite
                        profiled.append(keys[index])
                        norms.append(stat[0])

    def _record(self, r: Any) -> None:
        if type(r) is schema.ForwardEvent:
            self._forward(r)
        elif type(r) is schema.BackwardEvent:
            self._backward(r)
        elif type(r) is schema.Module:
            m = self.c.modules.setdefault((r.model, r.name), ModuleStats(
                r.model, r.name, r.cls, r.params, r.trainable))
            if m.trainable:
                self._trainable.add(self._key_index((r.model, r.name)))
            self._ids.clear()
        elif type(r) is schema.Model:
            self.c.models[r.model] = r.name
        elif type(r) is schema.ParamGrads:
            if self._wanted(r.step):
                self._param_grads(r)
        elif type(r) is schema.Anomaly:
            if self._wanted(r.step):
                self._anomaly(r)
        elif type(r) is schema.Step:
            self._closed.add(r.step)
        elif type(r) is schema.Signal:
            self.c.signals.append(r)
        elif type(r) is schema.Source:
            self.c.sources.setdefault(r.cls, f"{r.file}:{r.line}")
        elif type(r) is schema.End:
            self.c.end = r

    def _key_index(self, key: ModuleKey) -> int:
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self._keys)
            self._keys.append(key)
        return index

    def _id(self, ident: int) -> int:
        """The index of a module id, the first time it is used since a module record."""
        index = self._ids[ident] = self._key_index(self._decoder.modules[ident])
        return index

    def _wanted(self, step: int | None) -> bool:
        return self._only is None or step == self._only

    def _union(self, sets: dict[int, Indices], step: int, indices: Indices) -> None:
        if indices:
            old = sets.get(step)
            new = indices if old is None else old | indices
            sets[step] = self._sets.setdefault(new, new)

    # -- forward -------------------------------------------------------------------------------

    def _forward_step(self, step: int | None) -> None:
        """The forward calls change step (None: the log ended): count the step's calls."""
        if self._bcalls:
            self._close_backward()
        self._compare_orders()
        if self._seqs:
            self._sync()
            if self._calls and self._step is not None:
                self._count(self._step)
            self._seqs.clear()
            self._calls.clear()
            self._no_grad.clear()
            self._synced = 0
            self._recomputed = False
        if step is not None:
            self._step = step
            self.c.steps_seen.add(step)
            self._prune(step)
            if step not in self._flow_steps and len(self._flow_steps) < flow.STEPS:
                self._flow_steps.add(step)
            self._flowing = step in self._flow_steps

    def _sync(self) -> None:
        """Put the step's forward seqs not yet there in _fwd_step (a backward looks them up)."""
        step = self._step
        if self._synced < len(self._seqs) and step is not None:
            new = self._seqs[self._synced:]
            self._fwd_step.update(dict.fromkeys(new, step))
            self._recent.append((step, new))
            self._synced = len(self._seqs)

    def _prune(self, step: int) -> None:
        """A forward call is paired within a step or two (a GAN's generator); forget older ones."""
        kept = []
        for at, seqs in self._recent:
            if at >= step - 2:
                kept.append((at, seqs))
                continue
            for seq in seqs:
                if self._fwd_step.get(seq) == at:  # not since given to a later step
                    del self._fwd_step[seq]
        self._recent[:] = kept

    def _count(self, step: int) -> None:
        """Count the step's forward calls, once per distinct sequence of calls."""
        key = (tuple(self._calls), tuple(self._no_grad))
        pattern = self._patterns.get(key)
        if pattern is None:  # new calls: the first call of a module may be among them
            if len(self._patterns) >= _PATTERNS:
                self._add_patterns()
            calls = Counter(i for i in self._calls if i is not None)
            for seq, index in zip(self._seqs, self._calls, strict=True):
                m = self._module(self._keys[index]) if index is not None else None
                if m is not None and m.first_seq is None:
                    m.first_seq = seq
            grad_calls = calls - Counter(self._no_grad)
            pattern = self._patterns[key] = _Pattern(
                dict(calls), dict(grad_calls), frozenset(grad_calls), frozenset(self._no_grad))
        pattern.runs += 1
        self._union(self._grad, step, pattern.grad)
        self._union(self._no_grad_steps, step, pattern.no_grad)

    def _module(self, key: ModuleKey) -> ModuleStats:
        m = self.c.modules.get(key)
        if m is None:  # a module made inside forward: no module record
            m = self.c.modules[key] = ModuleStats(key[0], key[1], "?")
        return m

    def _forward(self, e: schema.ForwardEvent) -> None:
        """A forward event with flags or NaN/Inf outputs, in the same lists as plain ones."""
        if self._bcalls:
            self._close_backward()
        if e.step != self._step:
            self._forward_step(e.step)
        self._seqs.append(e.seq)
        if not self._wanted(e.step):
            return
        index = self._key_index((e.model, e.name))
        if e.recompute:
            self._calls.append(None)
            self._recomputed = True
            original = self._flow_calls.get((e.step, index, e.call))
            if original is not None:  # its backward is the original call's
                self._flow[e.seq] = original
            return
        self._calls.append(index)
        if self._flowing:
            self._flow_call(e.step, e.seq, index, e.call, not e.no_grad)
        if e.no_grad:
            self._no_grad.append(index)
        if e.output_nonfinite:
            self.c.forward_nonfinite_steps.add(e.step)
            if self.c.first_forward_nonfinite is None:
                self.c.first_forward_nonfinite = Nonfinite(e.step, e.model, e.name, {
                    "call": e.call, "outputs": [
                        {"index": i, "shape": e.output_shapes[i] if i < len(e.output_shapes)
                         else None, "nan": nan, "inf": inf}
                        for i, nan, inf in e.output_nonfinite],
                })

    def _flow_call(self, step: int, seq: int, index: int, call: int, grad: bool) -> None:
        judged = self._flow[seq] = flow.Call(step, seq, self._keys[index], call, grad)
        self._flow_calls[(step, index, call)] = judged

    def _compare_orders(self) -> None:
        """Does the step's backward run its calls in the reverse of their forward order?"""
        if self.c.order_mismatch is None and self._backward_fwds:
            if len(self._calls) == len(self._seqs) and not self._recomputed:
                called = set(self._seqs)  # the usual: every forward was a call
            else:
                called = {s for s, i in zip(self._seqs, self._calls, strict=False)
                          if i is not None}
            backward = list(filter(called.__contains__, self._backward_fwds))
            mirrored = sorted(set(backward), reverse=True)  # seqs grow in forward order
            got = next((g for g, e in zip(backward, mirrored, strict=False) if g != e), None) \
                if backward != mirrored else None
            if got is not None and self._step is not None:  # its module: of the last such call
                index = next(i for s, i in zip(reversed(self._seqs), reversed(self._calls),
                                               strict=True) if s == got and i is not None)
                self.c.order_mismatch = (self._step, *self._keys[index])
        self._backward_fwds.clear()

    # -- backward ------------------------------------------------------------------------------

    def _backward_step(self, step: int | None) -> None:
        """The backward events change step (None: the log ended)."""
        if self._bcalls:
            self._close_backward()
        if self._norms and self._bstep is not None:
            self._keep_profile(self._bstep)
        self._bstep = step
        if step is not None and self._wanted(step):
            self.c.backward_steps.add(step)

    def _keep_profile(self, step: int) -> None:
        """The step's profile as tuples (lists would be scanned by every garbage collection),
        after the part of it read before, if the log came back to the step."""
        modules, norms = tuple(self._profiled), tuple(self._norms)
        if step in self.c.profiles:
            before, before_norms = self.c.profiles[step]
            modules, norms = before + modules, before_norms + norms
        self.c.profiles[step] = (self._shared.setdefault(modules, modules), norms)
        self._profiled.clear()
        self._norms.clear()

    def _close_backward(self) -> None:
        """Which forward step each of these backward events belongs to, as sets per step."""
        self._sync()
        step = self._bstep
        assert step is not None
        if set(map(self._fwd_step.get, self._bfwds)) == {step}:  # the usual: this step's calls
            self._union(self._backed, step, frozenset(self._bcalls))
        else:
            for index, fwd in zip(self._bcalls, self._bfwds, strict=True):
                self._union(self._backed, self._fwd_step.get(fwd, step), frozenset((index,)))
        self._last_backward = (step, self._bcalls[-1])
        if self.c.order_mismatch is None:
            self._backward_fwds += self._bfwds
        self._bcalls.clear()
        self._bfwds.clear()

    def _backward(self, e: schema.BackwardEvent) -> None:
        """A backward event with flags or NaN/Inf statistics, in the same lists as plain ones."""
        if e.step != self._bstep:
            self._backward_step(e.step)
        if not self._wanted(e.step):
            return
        index = self._key_index((e.model, e.name))
        self._bcalls.append(index)
        self._bfwds.append(e.fwd)
        call = self._flow.get(e.fwd)
        if call is not None:
            call.gradients(e.grad_output_stats, e.grad_input_stats)
            call.lost = call.lost or bool(e.lost)
        outs = e.grad_output_stats or []
        if index in self._trainable and outs and outs[0] is not None \
                and math.isfinite(outs[0][0]):
            self._profiled.append((e.model, e.name))
            self._norms.append(outs[0][0])
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

    # -- other records -------------------------------------------------------------------------

    def _add_patterns(self) -> None:
        """Add the calls of the counted steps to their modules, and forget the patterns."""
        for pattern in self._patterns.values():
            for index, n in pattern.calls.items():
                m = self._module(self._keys[index])
                m.calls += n * pattern.runs
                m.max_calls_per_step = max(m.max_calls_per_step, pattern.grad_calls.get(index, 0))
        self._patterns.clear()

    def _finish(self) -> None:
        """The per-step sets as module keys; the judged calls."""
        self.c.calls = list(self._flow_calls.values())
        if self._last_backward is not None and self._last_backward[0] not in self._closed:
            step, index = self._last_backward
            self.c.unfinished = (step, self._keys[index])
        as_keys: dict[Indices, Keys] = {}
        for sets, out in ((self._grad, self.c.grad), (self._no_grad_steps, self.c.no_grad),
                          (self._backed, self.c.backward)):
            for step, indices in sets.items():
                if indices not in as_keys:
                    as_keys[indices] = frozenset(self._keys[i] for i in indices)
                out[step] = as_keys[indices]

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

    def _param_grads(self, r: schema.ParamGrads) -> None:
        names = tuple(r.grad_norm)
        self.c.param_norms.setdefault(r.step, []).append(
            (r.model, self._shared.setdefault(names, names), tuple(r.grad_norm.values())))
        # the sum is finite when every norm is: the exact test only runs when it is not
        if not math.isfinite(sum(filter(None, r.grad_norm.values()))) and any(
                v is not None and not math.isfinite(v) for v in r.grad_norm.values()):
            self.c.backward_nonfinite_steps.add(r.step)
            if self.c.first_backward_nonfinite is None:
                name = next(k for k, v in r.grad_norm.items()
                            if v is not None and not math.isfinite(v))
                self.c.first_backward_nonfinite = Nonfinite(r.step, r.model, name, {
                    "produced": True, "parameter_grad_norm": str(r.grad_norm[name])})


def collect(path: str | os.PathLike[str], step: int | None = None) -> Collected:
    reader = LogReader(path)
    collected = _Collector(reader, step).feed(reader)
    collected.warnings.extend(reader.warnings)
    return collected

"""One streaming pass over a log into what the checks need (``Collected``).

Memory grows with the number of modules and the events of a few steps (forward calls wait at
most two steps for their backward); per step it keeps the profile and parameter norms, and which
modules ran and got a backward, as one shared set per distinct set of modules.

Speed: a step's events go into lists of module indices, counted when the step ends. A training
loop repeats one step, so its forward calls are counted once per distinct sequence of calls (a
``Patterns``), not once per event. Rows with ``more`` (a flag, NaN/Inf) are looked at further.
"""

from __future__ import annotations

import math
import os
from typing import Any

from hooktrace.check import firstnan, flow, ops
from hooktrace.check.calls import JudgedCall, take_zero_shares, whole_drop
from hooktrace.check.collected import Collected, LossCall, ModuleStats
from hooktrace.check.keys import ModelFqn, ModelFqns
from hooktrace.check.losses import LOSSES
from hooktrace.check.patterns import Indices, Patterns
from hooktrace.log import schema
from hooktrace.log.decoder import BackwardRows, ForwardMore, ForwardRows, Signature
from hooktrace.log.options import TraceOptions
from hooktrace.log.reader import LogReader


class Collector:
    """Takes the items of one ``LogReader.scan`` (``take``), in order; ``finish`` gives what
    they add up to. ``step``: that step only."""

    def __init__(self, reader: LogReader, step: int | None = None) -> None:
        self.c = Collected(header=reader.header, log=str(reader.path))
        self._reader = reader
        self._only_step = step
        self._keys: list[ModelFqn] = []  # a module's index -> its key
        self._index_of_key: dict[ModelFqn, int] = {}
        self._index_of_id: dict[int, int] = {}  # the log's module id -> index (ids may move)
        self._trainable: set[int] = set()
        self._losses: set[int] = set()  # loss modules not yet called
        self._step_of_forward: dict[int, int] = {}  # forward seq -> its step, recent steps only
        self._recent: list[tuple[int, list[int]]] = []  # (step, its forward seqs) in it
        self._forwards_step: int | None = None  # of the forward calls since it last changed:
        self._forward_seqs: list[int] = []  # every forward's seq
        self._forward_calls: list[int | None] = []  # wanted: module index; None: a recompute
        self._no_grad_calls: list[int] = []
        self._eval_calls: list[int] = []  # in eval mode with gradient recording on
        self._recomputed = False  # a None in _forward_calls
        self._seqs_indexed = 0  # how many of _forward_seqs are in _step_of_forward
        self._backwards_step: int | None = None  # of the backward events in these lists:
        self._backward_calls: list[int] = []
        self._backward_fwds: list[int] = []
        self._profile_modules: list[ModelFqn] = []  # the profile of that step, so far
        self._profile_norms: list[float] = []
        self._backward_order: list[int] = []  # the forward seq of this step's backward events
        self._patterns = Patterns(lambda index: self._module(self._keys[index]))
        self._interned_sets: dict[Indices, Indices] = {}  # one object per distinct set
        self._interned: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # of profiles and params
        self._grad_sets: dict[int, Indices] = {}  # the sets of Collected, as indices
        self._no_grad_sets: dict[int, Indices] = {}
        self._eval_sets: dict[int, Indices] = {}
        self._backward_sets: dict[int, Indices] = {}
        # the calls of the steps judged call by call (flow.STEPS), by forward seq; and by
        # (step, module index, call index), for the backward of a recomputed call
        self._judged: dict[int, JudgedCall] = {}
        self._judged_calls: dict[tuple[int, int, int], JudgedCall] = {}
        self._judged_steps: set[int] = set()
        self._judging = False  # the forward calls' step is judged
        self._last_backward: tuple[int, int] | None = None  # (step, module index)
        self._closed: set[int] = set()  # steps with a step record
        # forward events say what went into their outputs without history; every module traced
        self._says_history = (reader.header.made_no_history
                              and not TraceOptions.from_header(reader.header).filtered)

    def take(self, item: ForwardRows | BackwardRows | schema.Record) -> None:
        """One item of the scan: rows of one type, or a record."""
        if isinstance(item, ForwardRows):
            self.c.events += len(item)
            self._forwards(item)
        elif isinstance(item, BackwardRows):
            self.c.events += len(item)
            self._backwards(item)
        else:
            self._record(item)

    def finish(self) -> Collected:
        self._start_forward_step(None)
        self._start_backward_step(None)
        self._patterns.flush()
        self._finish()
        self.c.warnings.extend(self._reader.warnings)
        return self.c

    def _forwards(self, rows: ForwardRows) -> None:
        """Forward rows: into the lists of their step (a tight loop: most of a log is these)."""
        if self._backward_calls:
            self._close_backward()
        ids, only, seqs, calls = self._index_of_id, self._only_step, self._forward_seqs, \
            self._forward_calls
        losses = self._losses
        for seq, step, module, call, ins, outs, more in rows:
            if step != self._forwards_step:
                self._start_forward_step(step)
            seqs.append(seq)
            if only is None or step == only:
                index = ids[module] if module in ids else self._id(module)
                if index in losses:
                    self._loss_call(step, index, ins)
                if more is not None:
                    self._unusual_forward(seq, step, index, call, ins, outs, more)
                    continue
                calls.append(index)
                if self._judging:
                    self._judge_call(step, seq, index, call, True, ins, outs)

    def _backwards(self, rows: BackwardRows) -> None:
        """Backward rows: into the lists of their step (--step: and its calls' later backward)."""
        ids, only, trainable, judged, step_of = self._index_of_id, self._only_step, \
            self._trainable, self._judged, self._step_of_forward.get
        calls, fwds, modules, norms = self._backward_calls, self._backward_fwds, \
            self._profile_modules, self._profile_norms
        for _, step, module, call, fwd, _, _, in_stats, out_stats, more in rows:
            if step != self._backwards_step:
                self._start_backward_step(step)
            if only is None or step == only or step_of(fwd, self._forwards_step) == only:
                index = ids[module] if module in ids else self._id(module)
                calls.append(index)
                fwds.append(fwd)
                if judged and (judging := judged.get(fwd)) is not None:
                    judging.gradients(out_stats, in_stats)
                    judging.lost = judging.lost or bool(more and more.lost)
                if index in trainable and out_stats and (stat := out_stats[0]) is not None \
                        and (more is None or math.isfinite(stat[0])):
                    modules.append(self._keys[index])
                    norms.append(stat[0])
                if more is not None:  # NaN/Inf statistics (or a flag)
                    firstnan.gradients(self.c, step, self._keys[index], call, in_stats,
                                       out_stats)

    def _record(self, r: schema.Record) -> None:
        if type(r) is schema.Module:
            self.c.names.take(r)
            m = self.c.modules.setdefault((r.model, r.fqn), ModuleStats(
                r.model, r.fqn, r.cls, r.params, r.trainable, loose=tuple(r.loose or ()),
                drop=None if r.drop is None else (r.drop, r.drop_unit or schema.DropUnit.ELEMENT),
                wrapper=r.wrapper, aliases=tuple(r.aliases or ()),
                alias_of=r.alias_of))
            if m.trainable:
                self._trainable.add(self._key_index((r.model, r.fqn)))
            if r.cls in LOSSES:
                self._losses.add(self._key_index((r.model, r.fqn)))
            self._index_of_id.clear()
        elif type(r) is schema.Model or type(r) is schema.Source:
            self.c.names.take(r)
        elif type(r) is schema.ParamGrads:
            if self._wanted(r.step):
                self._param_grads(r)
        elif type(r) is schema.Anomaly:
            self.c.steps_seen.add(r.step)  # a watched step: what went wrong is all it writes
            if self._wanted(r.step) and r.kind == schema.AnomalyKind.NO_GRAD:
                self.c.lost_gradient.setdefault((r.model, r.fqn), []).append(r.step)
                self.c.lost_detail.setdefault((r.model, r.fqn), r.detail)
            elif self._wanted(r.step):
                firstnan.anomaly(self.c, r)
        elif type(r) is schema.Step:
            self._closed.add(r.step)
            self.c.last_step = max(r.step, -1 if self.c.last_step is None else self.c.last_step)
        elif type(r) is schema.Signal:
            if r.kind == schema.SignalKind.GRAD_ZEROS:
                take_zero_shares(self._judged, r.detail.get("share"))
            else:
                self.c.signals.append(r)
        elif type(r) is schema.Ops:
            kept = self.c.ops.setdefault((r.model, r.fqn), [])
            if len(kept) < ops.KEEP and self._wanted(r.step):
                kept.append(r)
        elif type(r) is schema.End:
            self.c.end = r

    def _loss_call(self, step: int, index: int, ins: Signature) -> None:
        """A loss module's first call: its inputs' shapes and what it took them from."""
        self._losses.discard(index)
        before = [self._keys[i] for i in self._forward_calls[-2:] if i is not None]
        model_last = len(before) == 2 and before[1][1] == "" and before[0][0] == before[1][0]
        self.c.losses[self._keys[index]] = LossCall(step, list(ins[0]),
                                                    before[0] if model_last else None)

    def _key_index(self, key: ModelFqn) -> int:
        index = self._index_of_key.get(key)
        if index is None:
            index = self._index_of_key[key] = len(self._keys)
            self._keys.append(key)
        return index

    def _id(self, ident: int) -> int:
        """The index of a module id, the first time it is used since a module record."""
        index = self._index_of_id[ident] = self._key_index(self._reader.modules[ident])
        return index

    def _wanted(self, step: int | None) -> bool:
        return self._only_step is None or step == self._only_step

    def _union(self, sets: dict[int, Indices], step: int, indices: Indices) -> None:
        if indices:
            old = sets.get(step)
            new = indices if old is None else old | indices
            sets[step] = self._interned_sets.setdefault(new, new)

    # -- forward -------------------------------------------------------------------------------

    def _start_forward_step(self, step: int | None) -> None:
        """The forward calls change step (None: the log ended): count the step's calls."""
        if self._backward_calls:
            self._close_backward()
        self._compare_orders()
        if self._forward_seqs:
            self._index_seqs()
            if self._forward_calls and self._forwards_step is not None:
                self._count(self._forwards_step)
            self._forward_seqs.clear()
            self._forward_calls.clear()
            self._no_grad_calls.clear()
            self._eval_calls.clear()
            self._seqs_indexed = 0
            self._recomputed = False
        if step is not None:
            self._forwards_step = step
            self.c.steps_seen.add(step)
            self._prune(step)
            if step not in self._judged_steps and len(self._judged_steps) < flow.STEPS:
                self._judged_steps.add(step)
            self._judging = step in self._judged_steps

    def _index_seqs(self) -> None:
        """Put the step's forward seqs not yet there in _step_of_forward (for the backward)."""
        step, seqs = self._forwards_step, self._forward_seqs
        if self._seqs_indexed < len(seqs) and step is not None:
            new = seqs[self._seqs_indexed:]
            self._step_of_forward.update(dict.fromkeys(new, step))
            self._recent.append((step, new))
            self._seqs_indexed = len(seqs)

    def _prune(self, step: int) -> None:
        """A forward call is paired within a step or two (a GAN's generator); forget older ones."""
        kept = []
        for at, seqs in self._recent:
            if at >= step - 2:
                kept.append((at, seqs))
                continue
            for seq in seqs:
                if self._step_of_forward.get(seq) == at:  # not since given to a later step
                    del self._step_of_forward[seq]
        self._recent[:] = kept

    def _count(self, step: int) -> None:
        """Count the step's forward calls, once per distinct sequence of calls."""
        pattern = self._patterns.count(self._forward_calls, self._no_grad_calls,
                                       self._forward_seqs, self._eval_calls)
        self._union(self._grad_sets, step, pattern.grad)
        self._union(self._no_grad_sets, step, pattern.no_grad)
        self._union(self._eval_sets, step, pattern.eval_mode)

    def _module(self, key: ModelFqn) -> ModuleStats:
        m = self.c.modules.get(key)
        if m is None:  # a module made inside forward: no module record
            m = self.c.modules[key] = ModuleStats(key[0], key[1], "?")
        return m

    def _unusual_forward(self, seq: int, step: int, index: int, call: int,
                         ins: Signature, outs: Signature, more: ForwardMore) -> None:
        """A forward call with a flag or NaN/Inf outputs (``outs``: their shapes, dtypes)."""
        if more.recompute:
            self._forward_calls.append(None)
            self._recomputed = True
            original = self._judged_calls.get((step, index, call))
            if original is not None:  # its backward is the original call's
                self._judged[seq] = original
            return
        before = next((i for i in reversed(self._forward_calls) if i is not None), None)
        self._forward_calls.append(index)
        if self._judging:
            self._judge_call(step, seq, index, call, not more.no_grad, ins, outs,
                             more.eval_mode, more.made_no_history)
        if more.no_grad:
            self._no_grad_calls.append(index)
        elif more.eval_mode:
            self._eval_calls.append(index)
        if more.output_nonfinite:
            firstnan.forward_outputs(self.c, step, self._keys[index], call, *outs,
                                     more.output_nonfinite,
                                     None if before is None else self._keys[before])

    def _judge_call(self, step: int, seq: int, index: int, call: int, grad: bool,
                    ins: Signature, outs: Signature, eval_mode: bool = False,
                    no_history: bool = False) -> None:
        shapes = outs[0]  # a softmax or norm over a last dim of size 1 is a constant
        unit = bool(shapes) and type(shapes[0]) is list and shapes[0][-1:] == [1]
        key = self._keys[index]
        m = self.c.modules.get(key)
        chance = None if m is None or m.drop is None else whole_drop(*m.drop, ins[0])
        seqs = self._forward_seqs  # this call's seq last
        judged = self._judged[seq] = JudgedCall(
            step, seq, key, call, grad, unit_last=unit, chance=chance,
            half="float16" in outs[1], out_shapes=shapes, eval_mode=eval_mode,
            after=seqs[-2] if len(seqs) > 1 else -1,
            made_no_history=no_history if self._says_history else None)
        self._judged_calls[(step, index, call)] = judged

    def _compare_orders(self) -> None:
        """Does the step's backward run its calls in the reverse of their forward order?"""
        seqs, calls = self._forward_seqs, self._forward_calls
        if self.c.order_mismatch is None and self._backward_order:
            if len(calls) == len(seqs) and not self._recomputed:
                called = set(seqs)  # the usual: every forward was a call
            else:
                called = {s for s, i in zip(seqs, calls, strict=False) if i is not None}
            backward = list(filter(called.__contains__, self._backward_order))
            mirrored = sorted(set(backward), reverse=True)  # seqs grow in forward order
            got = next((g for g, e in zip(backward, mirrored, strict=False) if g != e), None) \
                if backward != mirrored else None
            if got is not None and self._forwards_step is not None:  # of the last such call
                index = next(i for s, i in zip(reversed(seqs), reversed(calls), strict=True)
                             if s == got and i is not None)
                self.c.order_mismatch = (self._forwards_step, *self._keys[index])
        self._backward_order.clear()

    # -- backward ------------------------------------------------------------------------------

    def _start_backward_step(self, step: int | None) -> None:
        """The backward events change step (None: the log ended)."""
        if self._backward_calls:
            self._close_backward()
        if self._profile_norms and self._backwards_step is not None:
            self._keep_profile(self._backwards_step)
        self._backwards_step = step
        if step is not None and self._wanted(step):
            self.c.backward_steps.add(step)

    def _keep_profile(self, step: int) -> None:
        """The step's profile as tuples (lists would be scanned by every garbage collection),
        after the part of it read before, if the log came back to the step."""
        modules, norms = tuple(self._profile_modules), tuple(self._profile_norms)
        if step in self.c.profiles:
            before, before_norms = self.c.profiles[step]
            modules, norms = before + modules, before_norms + norms
        self.c.profiles[step] = (self._interned.setdefault(modules, modules), norms)
        self._profile_modules.clear()
        self._profile_norms.clear()

    def _close_backward(self) -> None:
        """Which forward step each of these backward events belongs to, as sets per step."""
        self._index_seqs()
        step, calls, fwds = self._backwards_step, self._backward_calls, self._backward_fwds
        assert step is not None
        if set(map(self._step_of_forward.get, fwds)) == {step}:  # the usual: this step's calls
            self._union(self._backward_sets, step, frozenset(calls))
        else:
            for index, fwd in zip(calls, fwds, strict=True):
                self._union(self._backward_sets, self._step_of_forward.get(fwd, step),
                            frozenset((index,)))
        self._last_backward = (step, calls[-1])
        if self.c.order_mismatch is None:
            self._backward_order += fwds
        calls.clear()
        fwds.clear()

    # -- other records -------------------------------------------------------------------------

    def _finish(self) -> None:
        """The per-step sets as module keys; the judged calls; the true gradient norms."""
        self.c.calls = list(self._judged_calls.values())
        self.c.unscale()
        if self._last_backward is not None and self._last_backward[0] not in self._closed:
            step, index = self._last_backward
            self.c.unfinished = (step, self._keys[index])
        as_keys: dict[Indices, ModelFqns] = {}
        for sets, out in ((self._grad_sets, self.c.grad), (self._no_grad_sets, self.c.no_grad),
                          (self._eval_sets, self.c.eval_mode),
                          (self._backward_sets, self.c.backward)):
            for step, indices in sets.items():
                if indices not in as_keys:
                    as_keys[indices] = frozenset(self._keys[i] for i in indices)
                out[step] = as_keys[indices]

    def _param_grads(self, r: schema.ParamGrads) -> None:
        names = tuple(r.grad_norm)
        self.c.param_norms.setdefault(r.step, []).append(
            (r.model, self._interned.setdefault(names, names), tuple(r.grad_norm.values())))
        firstnan.parameter_norms(self.c, r)


def collect(path: str | os.PathLike[str], step: int | None = None) -> Collected:
    """Read the log at ``path`` once; ``step``: that step only."""
    reader = LogReader(path)
    collector = Collector(reader, step)
    for item in reader.scan():
        collector.take(item)
    return collector.finish()

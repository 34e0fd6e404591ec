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

from hooktrace.check import flow, nonfinite
from hooktrace.check.calls import JudgedCall, Judging, take_zero_shares
from hooktrace.check.collected import Collected
from hooktrace.check.indexing import (
    ForwardSteps,
    Modules,
    Patterns,
    Profiles,
    StepSets,
    order_break,
)
from hooktrace.check.oplines import KEEP
from hooktrace.log import schema
from hooktrace.log.decoder import BackwardRows, ForwardMore, ForwardRows, Signature
from hooktrace.log.options import TraceOptions
from hooktrace.log.reader import LogReader


class Collector:
    """Takes the items of one ``LogReader.scan`` in order; ``finish`` gives what they add up to."""

    def __init__(self, reader: LogReader, step: int | None = None) -> None:
        self.c = Collected(header=reader.header, log=str(reader.path))
        self._reader = reader
        self._only_step = step
        self._ix = Modules(reader, self.c)
        self._keys = self._ix.keys  # a module's index -> its key
        self._fwd_steps = ForwardSteps()
        self._forwards_step: int | None = None  # of the forward calls since it last changed:
        self._forward_seqs: list[int] = []  # every forward's seq
        self._forward_calls: list[int | None] = []  # wanted: module index; None: a recompute
        self._no_grad_calls: list[int] = []
        self._eval_calls: list[int] = []  # in eval mode with gradient recording on
        self._backwards_step: int | None = None  # of the backward events in these lists:
        self._backward_calls: list[int] = []
        self._backward_fwds: list[int] = []
        self._profiles = Profiles(self.c)
        self._backward_order: list[int] = []  # the forward seq of this step's backward events
        self._patterns = Patterns(self._ix.stats)
        self._sets = StepSets()  # the sets of Collected, as indices
        self._last_backward: tuple[int, int] | None = None  # (step, module index)
        self._closed: set[int] = set()  # steps with a step record
        self._judging = Judging(flow.STEPS, reader.header.made_no_history
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
        """What the items add up to: the per-step sets as module keys, the judged calls, the
        true gradient norms, a backward pass that never ended."""
        self._start_forward_step(None)
        self._start_backward_step(None)
        self._patterns.flush()
        self.c.calls = self._judging.calls()
        self.c.unscale()
        if self._last_backward is not None and self._last_backward[0] not in self._closed:
            step, index = self._last_backward
            self.c.unfinished = (step, self._keys[index])
        self._sets.into(self.c, self._keys)
        self.c.warnings.extend(self._reader.warnings)
        return self.c

    def _forwards(self, rows: ForwardRows) -> None:
        """Forward rows: into the lists of their step (a tight loop: most of a log is these)."""
        if self._backward_calls:
            self._close_backward()
        ids, only, seqs, calls = self._ix.of_id, self._only_step, self._forward_seqs, \
            self._forward_calls
        losses = self._ix.losses
        for seq, step, module, call, ins, outs, more in rows:
            if step != self._forwards_step:
                self._start_forward_step(step)
            seqs.append(seq)
            if only is None or step == only:
                index = ids[module] if module in ids else self._ix.of(module)
                if index in losses:
                    self._ix.loss_call(step, index, ins, calls[-2:])
                if more is not None:
                    self._unusual_forward(seq, step, index, call, ins, outs, more)
                    continue
                calls.append(index)
                if self._judging.on:
                    self._judge_call(step, seq, index, call, True, ins, outs)

    def _backwards(self, rows: BackwardRows) -> None:
        """Backward rows: into the lists of their step (--step: and its calls' later backward)."""
        ids, only, trainable, judged, step_of = self._ix.of_id, self._only_step, \
            self._ix.trainable, self._judging.by_seq, self._fwd_steps.step_of.get
        calls, fwds, modules, norms = self._backward_calls, self._backward_fwds, \
            self._profiles.modules, self._profiles.norms
        for _, step, module, call, fwd, _, _, in_stats, out_stats, more in rows:
            if step != self._backwards_step:
                self._start_backward_step(step)
            if only is None or step == only or step_of(fwd, self._forwards_step) == only:
                index = ids[module] if module in ids else self._ix.of(module)
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
                    nonfinite.gradients(self.c, step, self._keys[index], call, in_stats,
                                       out_stats)

    def _record(self, r: schema.Record) -> None:
        if type(r) is schema.Module:
            self._ix.take(r)
        elif type(r) is schema.Model or type(r) is schema.Source:
            self.c.names.take(r)
        elif type(r) is schema.ParamGrads:
            if self._wanted(r.step):
                self._profiles.params(r)
                nonfinite.parameter_norms(self.c, r)
        elif type(r) is schema.Anomaly:
            self.c.steps_seen.add(r.step)  # a watched step: what went wrong is all it writes
            if self._wanted(r.step) and r.kind == schema.AnomalyKind.NO_GRAD:
                self.c.lost_gradient.setdefault((r.model, r.fqn), []).append(r.step)
                self.c.lost_detail.setdefault((r.model, r.fqn), r.detail)
            elif self._wanted(r.step):
                nonfinite.anomaly(self.c, r)
        elif type(r) is schema.Step:
            self._closed.add(r.step)
            self.c.last_step = max(r.step, -1 if self.c.last_step is None else self.c.last_step)
        elif type(r) is schema.Signal:
            if r.kind == schema.SignalKind.GRAD_ZEROS:
                take_zero_shares(self._judging.by_seq, r.detail.get("share"))
            else:
                self.c.signals.append(r)
        elif type(r) is schema.Ops:
            kept = self.c.ops.setdefault((r.model, r.fqn), [])
            if len(kept) < KEEP and self._wanted(r.step):
                kept.append(r)
        elif type(r) is schema.End:
            self.c.end = r

    def _wanted(self, step: int | None) -> bool:
        return self._only_step is None or step == self._only_step

    # -- forward -------------------------------------------------------------------------------

    def _start_forward_step(self, step: int | None) -> None:
        """The forward calls change step (None: the log ended): count the step's calls."""
        if self._backward_calls:
            self._close_backward()
        self._compare_orders()
        if self._forward_seqs:
            self._fwd_steps.add(self._forwards_step, self._forward_seqs)
            if self._forward_calls and self._forwards_step is not None:
                self._count(self._forwards_step)
            self._forward_seqs.clear()
            self._forward_calls.clear()
            self._no_grad_calls.clear()
            self._eval_calls.clear()
            self._fwd_steps.indexed = 0
        if step is not None:
            self._forwards_step = step
            self.c.steps_seen.add(step)
            self._fwd_steps.prune(step)
            self._judging.start(step)

    def _count(self, step: int) -> None:
        """Count the step's forward calls, once per distinct sequence of calls."""
        pattern = self._patterns.count(self._forward_calls, self._no_grad_calls,
                                       self._forward_seqs, self._eval_calls)
        self._sets.add(self._sets.grad, step, pattern.grad)
        self._sets.add(self._sets.no_grad, step, pattern.no_grad)
        self._sets.add(self._sets.eval_mode, step, pattern.eval_mode)

    def _unusual_forward(self, seq: int, step: int, index: int, call: int,
                         ins: Signature, outs: Signature, more: ForwardMore) -> None:
        """A forward call with a flag or NaN/Inf outputs (``outs``: their shapes, dtypes)."""
        if more.recompute:
            self._forward_calls.append(None)
            self._judging.recompute(step, seq, index, call)
            return
        before = next((i for i in reversed(self._forward_calls) if i is not None), None)
        self._forward_calls.append(index)
        if self._judging.on:
            self._judge_call(step, seq, index, call, not more.no_grad, ins, outs,
                             more.eval_mode, more.made_no_history)
        if more.no_grad:
            self._no_grad_calls.append(index)
        elif more.eval_mode:
            self._eval_calls.append(index)
        if more.output_nonfinite:
            nonfinite.forward_outputs(self.c, step, self._keys[index], call, *outs,
                                     more.output_nonfinite,
                                     None if before is None else self._keys[before])

    def _judge_call(self, step: int, seq: int, index: int, call: int, grad: bool,
                    ins: Signature, outs: Signature, eval_mode: bool = False,
                    no_history: bool = False) -> None:
        shapes = outs[0]  # a softmax or norm over a last dim of size 1 is a constant
        unit = bool(shapes) and type(shapes[0]) is list and shapes[0][-1:] == [1]
        m = self.c.modules.get(key := self._keys[index])
        seqs = self._forward_seqs  # this call's seq last
        self._judging.add(JudgedCall(
            step, seq, key, call, grad, unit_last=unit, half="float16" in outs[1],
            out_shapes=shapes, eval_mode=eval_mode, after=seqs[-2] if len(seqs) > 1 else -1),
            index, None if m is None else m.drop, ins[0], no_history)

    def _compare_orders(self) -> None:
        """Does the step's backward run its calls in the reverse of their forward order?"""
        if self.c.order_mismatch is None and self._backward_order \
                and self._forwards_step is not None:
            index = order_break(self._forward_seqs, self._forward_calls, self._backward_order)
            if index is not None:  # of the last such call
                self.c.order_mismatch = (self._forwards_step, *self._keys[index])
        self._backward_order.clear()

    # -- backward ------------------------------------------------------------------------------

    def _start_backward_step(self, step: int | None) -> None:
        """The backward events change step (None: the log ended)."""
        if self._backward_calls:
            self._close_backward()
        if self._profiles.norms and self._backwards_step is not None:
            self._profiles.keep(self._backwards_step)
        self._backwards_step = step
        if step is not None and self._wanted(step):
            self.c.backward_steps.add(step)

    def _close_backward(self) -> None:
        """Which forward step each of these backward events belongs to, as sets per step."""
        self._fwd_steps.add(self._forwards_step, self._forward_seqs)
        step, calls, fwds = self._backwards_step, self._backward_calls, self._backward_fwds
        assert step is not None
        step_of, sets = self._fwd_steps.step_of, self._sets
        if set(map(step_of.get, fwds)) == {step}:  # the usual: this step's calls
            sets.add(sets.backward, step, frozenset(calls))
        else:
            for index, fwd in zip(calls, fwds, strict=True):
                sets.add(sets.backward, step_of.get(fwd, step), frozenset((index,)))
        self._last_backward = (step, calls[-1])
        if self.c.order_mismatch is None:
            self._backward_order += fwds
        calls.clear()
        fwds.clear()


def collect(path: str | os.PathLike[str], step: int | None = None) -> Collected:
    """Read the log at ``path`` once; ``step``: that step only."""
    reader = LogReader(path)
    collector = Collector(reader, step)
    for item in reader.scan():
        collector.take(item)
    return collector.finish()

"""The zoomed calls' ``ops`` records, and which calls to zoom into: by ``--ops`` glob, and
automatically after a recorded step showed something wrong at a module.

The zoom (``hooks/opzoom.py``) records the operations; this observer writes one ``ops`` record
per zoomed call after its step's events (the backward's numbers are in by then), and chooses
the modules. Automatically, a module is chosen for the later recorded steps when, in a recorded
step, what the tracer already has in hand says so, at no cost to a healthy step:

* the log writer marks an input ``lost`` (the gradient stopped inside the call), or meets the
  step's first NaN/Inf forward output (``fact``);
* the statistics met a gradient that is all zero or not finite (a branch the hot path does not
  take otherwise): the step's backward events are looked at once (``gradients``) for the call
  that produced NaN/Inf or passed back zero for a non-zero gradient, and for the call around
  one that received an exactly-zero gradient (not where another call of the same module got a
  non-zero one in the step: one call of an unrolled cell, makemore's GRU at its zero start);
* a module with trainable parameters of its own was called and its backward never began, while
  a module around it got one: the gradient stopped inside that one's forward (unless a lost
  input in the same model says where it stopped);
* inside a zoomed call, a child's call took an input that needed a gradient and gave an output
  that has none: the gradient stops inside the child's forward.

At most ``AUTO`` modules are chosen so, and only while a later step will be recorded.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.opzoom import MAX_CALLS, Zoomed, ZoomRequests
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.names import ancestors
from hooktrace.log.options import TraceOptions

AUTO = 4  # modules chosen automatically in a run
_HELD = 4 * MAX_CALLS  # zoomed calls held for their backward, at most (forward-only code)


class OpsObserver(Observer):
    """Writes the zoomed calls' operations; chooses the modules ``zoom`` zooms into."""

    follows = (Mode.RECORDED,)

    def __init__(self, zoom: ZoomRequests, emit: Emit, options: TraceOptions) -> None:
        self._zoom = zoom
        self._emit = emit
        self._globs = tuple(options.ops)
        self._steps = options.steps
        self._held: list[Zoomed] = []
        self._infos: dict[tuple[int, str], ModInfo] = {}
        self._auto = 0  # modules chosen automatically so far
        self._looked: set[ModInfo] = set()  # modules not reached, looked at once
        self._end: PassEnd | None = None  # the recorded pass whose events are being written
        self._told: set[int] = set()  # the models a fact named in that step
        self.open = self._later(-1)  # whether facts are wanted now (the log writer reads it)

    def take(self, zoomed: Zoomed) -> None:
        """A zoomed call returned: held for its backward."""
        self._held.append(zoomed)
        if len(self._held) > _HELD:  # no backward comes (forward-only code)
            self._write(self._held[:MAX_CALLS])
            del self._held[:MAX_CALLS]

    def module_seen(self, module: Any, info: ModInfo) -> None:
        self._infos.setdefault((info.model, info.fqn), info)
        if self._globs and any(fnmatch.fnmatchcase(info.fqn, g) for g in self._globs):
            self._zoom.choose(info)

    def backward_end(self, end: PassEnd) -> None:
        held = [z for z in self._held if z.call.step <= end.step]
        self._held = [z for z in self._held if z.call.step > end.step]
        self._write(held)
        self._zoom.new_step()
        self._end = end if end.mode is Mode.RECORDED else None

    def stop(self, step: int, mode: Mode) -> None:
        self._zoom.close()
        held, self._held = self._held, []
        self._write(held)

    # -- choosing ------------------------------------------------------------------------------
    def fact(self, model: int, name: str) -> None:
        """Something wrong at a module (a gradient lost, the first NaN/Inf): zoom into it."""
        info = self._infos.get((model, name))
        self._told.add(model)
        if info is not None and self._auto < AUTO and self._zoom.choose(info):
            self._auto += 1

    def written(self, events: Iterable[Any], unusual: bool) -> None:
        """The log writer wrote events (``unusual``: their statistics met a gradient all zero
        or not finite); after a recorded pass's, the modules it did not reach are looked at."""
        if unusual:
            for model, name in gradient_facts(events):
                self.fact(model, name)
        end, self._end = self._end, None
        if end is not None:
            self._unreached(end)
            self.open = self._later(end.step)
            self._told.clear()

    def _unreached(self, end: PassEnd) -> None:
        """Modules with trainable parameters called and never reached by the backward: the
        nearest module around each that was reached."""
        missing = set(end.called).difference(end.reached, self._looked)  # in C: most steps
        if not missing:
            return
        reached = {(i.model, i.fqn) for i in end.reached}
        for info in [i for i in end.called if i in missing]:  # in the order they ran
            if info.model in self._told:
                continue  # a lost input or a NaN/Inf there says more: looked at again later
            self._looked.add(info)
            if (info.model, info.fqn) in reached or not info.has_params:
                continue
            module = info.ref()
            if module is None or not any(p.requires_grad for p in module.parameters(False)):
                continue
            for name in ancestors(info.fqn)[::-1]:
                if (info.model, name) in reached:
                    self.fact(info.model, name)
                    break

    def _later(self, step: int) -> bool:
        last = self._steps.last
        return self._auto < AUTO and (last is None or step < last)

    # -- writing -------------------------------------------------------------------------------
    def _write(self, zoomed: Sequence[Zoomed]) -> None:
        for z in zoomed:
            call = z.call
            fwd, index = (call.seq, call.index) if call.info is not None else (-1, 0)
            self._emit(schema.Ops(call.step, fwd, z.info.model, z.info.fqn, index, z.inputs,
                                  z.in_grad, z.outputs, z.ops, z.more))
            for op in z.ops:
                if op.child is not None and any(op.in_grad) and op.outs and not any(op.out_grad) \
                        and not op.no_grad and self.open:
                    self.fact(z.info.model, op.child)


def _norm(stat: Any) -> float | None:
    return None if stat is None else float(stat[0])


def gradient_facts(events: Iterable[Any], most: int = AUTO) -> list[tuple[int, str]]:
    """In one step's events: the calls whose backward produced NaN/Inf from finite gradients or
    passed back exactly zero for a non-zero one, and, for a call that received an exactly-zero
    gradient, the nearest call around it that received a non-zero one."""
    backward = [e for e in events if type(e) is schema.BackwardEvent
                and e.grad_output_stats is not None]
    fed = {(e.model, e.fqn) for e in backward
           if any((n := _norm(s)) is not None and n > 0 for s in e.grad_output_stats or ())}
    found: dict[tuple[int, str], None] = {}
    zeroed: list[Any] = []  # calls that received exactly zero
    for e in backward:
        outs = [n for s in e.grad_output_stats or () if (n := _norm(s)) is not None]
        ins = [n for s in e.grad_input_stats or () if (n := _norm(s)) is not None]
        finite = all(math.isfinite(n) for n in outs)
        if finite and any(not math.isfinite(n) for n in ins):
            found[(e.model, e.fqn)] = None  # produced NaN/Inf
        elif finite and any(n > 0 for n in outs) and ins and not any(ins):
            found[(e.model, e.fqn)] = None  # passed back zero
        elif outs and not any(outs):
            zeroed.append(e)
    if not found:  # no call's backward made the zero: a forward around one did
        for e in zeroed:
            if (e.model, e.fqn) in fed:
                continue  # another call of it got a gradient: a loop's call given zero (a
                # GRU cell's reset gate at a hidden state of zero), not a module cut off
            around = next((n for n in ancestors(e.fqn)[::-1] if (e.model, n) in fed), None)
            if around is not None:
                found[(e.model, around)] = None
    return list(found)[:most]

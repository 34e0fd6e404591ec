"""The calls of one drawn step: each forward call of a module with its backward event, nested in
the call of the ancestor module it ran inside (``calls_of``). ``graph.build`` folds them into
nodes, ``flow`` follows the data between them. Standard library only: no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from hooktrace.log import schema
from hooktrace.log.names import ancestors
from hooktrace.show.picture import NodeKey
from hooktrace.show.steplog import ModuleKey, StepLog


def depth_of(fqn: str) -> int:
    """0 for a model's root (``""``), 1 for ``layer1``, 3 for ``layer1.0.conv1``."""
    return fqn.count(".") + 1 if fqn else 0


@dataclass(slots=True)
class Call:
    """One forward call of one module in the step, with its backward event if it had one."""

    model: int
    fqn: str
    call: int
    cls: str
    seq: int
    output_shapes: Sequence[schema.Shape]
    no_grad: bool
    recomputed: bool = False  # activation checkpointing re-ran it inside backward
    backward: schema.BackwardEvent | None = None
    later: int | None = None  # the step its backward ran in, when not this one
    nonfinite: bool = False  # an output held NaN/Inf
    parent: NodeKey | None = None  # the call of an ancestor module it ran inside
    children: int = 0
    inputs_from: Sequence[Sequence[int]] | None = None  # ForwardEvent's: what made its inputs
    made: Sequence[int] = ()  # ... and the calls inside it that made its outputs
    from_out: Sequence[Sequence[int]] | None = None  # ... which output of each producer
    made_out: Sequence[Sequence[int]] | None = None  # ... per output, the calls that made it

    @property
    def key(self) -> NodeKey:
        return (self.model, self.fqn, self.call)

    @property
    def depth(self) -> int:
        return depth_of(self.fqn)


def calls_of(log: StepLog) -> tuple[dict[NodeKey, Call], list[tuple[Call, schema.BackwardEvent]]]:
    """The step's forward calls in seq order, linked to their parents, and the backward events
    paired to them in backward order. A recompute maps to the call it re-ran."""
    calls: dict[NodeKey, Call] = {}
    by_seq: dict[int, NodeKey] = {}
    for e in log.events:
        if isinstance(e, schema.ForwardEvent):
            key = (e.model, e.fqn, e.call)
            by_seq[e.seq] = key
            if e.recompute:
                if key in calls:
                    calls[key].recomputed = True
            elif key not in calls:
                calls[key] = Call(e.model, e.fqn, e.call, log.cls(e.model, e.fqn), e.seq,
                                  e.output_shapes, e.no_grad, later=log.later.get(e.seq),
                                  nonfinite=bool(e.output_nonfinite),
                                  inputs_from=e.inputs_from, made=e.made or (),
                                  from_out=e.from_out, made_out=e.made_out)
    backward: list[tuple[Call, schema.BackwardEvent]] = []
    for e in log.events:
        if isinstance(e, schema.BackwardEvent):
            found = calls.get(by_seq.get(e.fwd, (e.model, e.fqn, e.call)))
            if found is not None:
                found.backward = found.backward or e
                backward.append((found, e))
    _link_parents(calls)
    return calls, backward


def _link_parents(calls: dict[NodeKey, Call]) -> None:
    seqs: dict[ModuleKey, list[int]] = {}
    for c in calls.values():  # seq order, so every list is sorted
        seqs.setdefault((c.model, c.fqn), []).append(c.seq)
    call_at = {c.seq: c for c in calls.values()}
    for c in calls.values():
        for fqn in reversed(ancestors(c.fqn)):  # nearest first
            above = seqs.get((c.model, fqn), [])
            i = bisect.bisect_right(above, c.seq)  # the first call of it to return after c
            if i < len(above):
                parent = call_at[above[i]]
                c.parent = parent.key
                parent.children += 1
                break

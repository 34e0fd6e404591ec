"""The edges of a drawn step that follow the data (``ForwardEvent.inputs_from``): from the call
that made a tensor to each call that used it, and backward the same edges reversed where the
gradient went back along them (docs/reading.md says what is drawn, and how boxes of calls stand
for their makers: ``_Ends``). Forward edges are numbered by the call that used the data, then
the one that made it; backward ones by when the gradient reached the producer, then when it left
the consumer. An edge to or from the node of a module's many calls counts its runs
(``Edge.runs``). Standard library only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hooktrace.log import schema
from hooktrace.log.gradstat import norm, worst
from hooktrace.show.calls import Call
from hooktrace.show.picture import Edge, NodeKey

CallNodes = dict[NodeKey, NodeKey | None]  # each call's node at the drawn depth; None: a cluster


@dataclass(slots=True)
class Link:
    """Data that one call's output carried into another call, as drawn: (src, dst) nodes."""

    producer: Call
    consumer: Call
    inputs: list[int]  # the consumer's inputs that it made
    src: NodeKey
    dst: NodeKey
    run: tuple[NodeKey | None, NodeKey | None]  # the calls' nodes with no module folded

    def gradient(self) -> bool:
        """Whether the gradient went back along it: the consumer's gradient of one of those
        inputs is in the log and the producer's backward ran in the step."""
        back = self.consumer.backward
        if back is None or self.producer.backward is None:
            return False
        grads = back.grad_input_shapes
        return any(i < len(grads) and grads[i] is not None for i in self.inputs)


def largest(events: Iterable[schema.BackwardEvent | None]) -> float | None:
    """The grad_output norm an edge run several times shows: the largest, or the first that
    is not finite (as a node's)."""
    return worst(n for e in events
                 if e is not None and (n := norm(e.grad_output_stats)) is not None)


def make_edge(src: NodeKey, dst: NodeKey, phase: str, numbers: Sequence[int],
              events: Sequence[schema.BackwardEvent] = (), mirrored: bool = True) -> Edge:
    """The edge run as ``numbers`` (its first and last, how often); backward, the label's
    tensor counts are those of its first event, its norm the largest of ``events``."""
    if phase == "forward":
        return Edge(src, dst, phase, numbers[0], runs=len(numbers), last=numbers[-1])
    first = min(events, key=lambda e: e.seq)
    return Edge(src, dst, phase, numbers[0], first.grad_input_len, first.grad_output_len,
                mirrored, largest(events), len(numbers), numbers[-1])


def has_flow(calls: Iterable[Call]) -> bool:
    return any(c.inputs_from is not None for c in calls)


def links(calls: dict[NodeKey, Call], keys: CallNodes, unfolded: CallNodes) -> list[Link]:
    """Every drawn link, in execution order (the consumer's seq, then the producer's)."""
    ends = _Ends(calls, keys)
    by_seq = ends.by_seq
    found: dict[tuple[int, int], Link] = {}
    for consumer in calls.values():  # seq order
        dst = keys[consumer.key]
        if dst is None or consumer.inputs_from is None:
            continue
        used = consumer.from_out
        for i, made_by in enumerate(consumer.inputs_from):
            for j, seq in enumerate(made_by):
                producer = by_seq.get(seq)  # None: of another step, or a model not drawn
                out = used[i][j] if used is not None else 0
                for end in ends.of(producer, True, out) if producer else ():
                    src = keys[end.key]
                    assert src is not None
                    run = (unfolded[end.key], unfolded[consumer.key])
                    if src == dst and run[0] == run[1]:
                        continue  # inside one node
                    link = found.get((end.seq, consumer.seq))
                    if link is None:
                        found[end.seq, consumer.seq] = Link(end, consumer, [i], src, dst, run)
                    elif i not in link.inputs:
                        link.inputs.append(i)
    return sorted(found.values(), key=lambda k: (k.consumer.seq, k.producer.seq))


class _Ends:
    """The drawn calls that stand for a call's outputs: the call, drawn as a node; drawn as a
    cluster, the calls that made its outputs (``made``; without any, those that made its
    inputs), each resolved so. Of those, the calls before it (data it passed on: a residual's
    skip) are followed one box back only: in a residual stream every block's output holds
    all the blocks' before it, and a picture with an edge from each would be unreadable."""

    def __init__(self, calls: dict[NodeKey, Call], keys: CallNodes) -> None:
        self.calls, self.keys = calls, keys
        self.by_seq = {c.seq: c for c in calls.values()}
        self._found: dict[tuple[NodeKey, bool, int], list[Call]] = {}

    def of(self, call: Call, skip: bool, out: int = -1) -> list[Call]:
        """``skip``: whether data that ``call`` passed on from before it is followed; ``out``:
        the output of ``call`` used (-1: any), whose makers alone stand for it where the log
        says which calls made each output (``made_out``)."""
        if self.keys[call.key] is not None:
            return [call]
        per_output = call.made_out
        if per_output is None or not 0 <= out < len(per_output):
            out = -1
        found = self._found.get((call.key, skip, out))
        if found is None:
            self._found[call.key, skip, out] = []  # producers come before: no cycle
            sources = (per_output[out] if per_output is not None and out >= 0 else call.made) \
                or [s for made_by in call.inputs_from or () for s in made_by]
            ends: dict[int, Call] = {}
            for seq in sources:
                made = self.by_seq.get(seq)  # None: a call of another step
                if made is None:
                    continue
                inside = self._inside(made, call)
                if inside or skip:  # one made before it: passed on, followed one box back
                    ends.update((e.seq, e) for e in self.of(made, skip and inside))
            found = self._found[call.key, skip, out] = list(ends.values())
        return found

    def _inside(self, call: Call, outer: Call) -> bool:
        parent = call.parent
        while parent is not None and parent != outer.key:
            parent = self.calls[parent].parent
        return parent is not None


def _numbered(found: Sequence[Link], fold: set[NodeKey]
              ) -> dict[tuple[NodeKey, NodeKey], list[tuple[int, Link]]]:
    """Each drawn edge with its runs, numbered in the order of ``found``: an edge is one run,
    but one to or from the node of a module's many calls (``fold``) a run per pair of calls
    (of the modules inside: ``Link.run``) it stands for."""
    edges: dict[tuple[NodeKey, NodeKey], list[tuple[int, Link]]] = {}
    runs: dict[tuple[NodeKey, NodeKey], set[tuple[NodeKey | None, NodeKey | None]]] = {}
    order = 0
    for link in found:
        key = (link.src, link.dst)
        seen = runs.setdefault(key, set())
        if key in edges and (not (link.src in fold or link.dst in fold) or link.run in seen):
            edges[key].append((edges[key][-1][0], link))  # the same run: its number
            continue
        order += 1
        seen.add(link.run)
        edges.setdefault(key, []).append((order, link))
    return edges


def data_edges(calls: dict[NodeKey, Call], keys: CallNodes, unfolded: CallNodes, fold: set[NodeKey],
               phase: str) -> list[Edge]:
    """The forward and backward edges of ``phase`` ("forward", "backward" or "both")."""
    found = links(calls, keys, unfolded)
    edges: list[Edge] = []
    if phase != "backward":
        edges += [make_edge(src, dst, "forward", sorted({n for n, _ in runs}))
                  for (src, dst), runs in _numbered(found, fold).items()]
    if phase != "forward":
        back = sorted((k for k in found if k.gradient()), key=_backward_order)
        for (src, dst), runs in _numbered(back, fold).items():
            events = [k.producer.backward for _, k in runs if k.producer.backward is not None]
            edges.append(make_edge(dst, src, "backward", sorted({n for n, _ in runs}), events))
    return edges


def _backward_order(link: Link) -> tuple[int, int]:
    made, used = link.producer.backward, link.consumer.backward
    assert made is not None and used is not None
    return made.seq, used.seq

"""Indexes that answer flow's per-call questions in log time, whatever the calls of a step.

``flow`` asks, for each call of a step, about the calls after it, before it or beside it. Asked
by scanning, an unrolled loop (an ``LSTMCell`` called 999 times in one step) costs the square
of its calls; these answer the same questions from numbers gathered once per step.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from hooktrace.log.names import ancestors

if TYPE_CHECKING:
    from hooktrace.check.calls import JudgedCall
    from hooktrace.check.keys import ModelFqn


class FirstAtLeast:
    """Over a list of numbers: the first index at or after ``i`` whose number is at least
    ``x`` (a max segment tree)."""

    def __init__(self, values: Sequence[float]) -> None:
        size = 1
        while size < len(values):
            size *= 2
        tree = [-math.inf] * (2 * size)
        tree[size:size + len(values)] = values
        for k in range(size - 1, 0, -1):
            tree[k] = max(tree[2 * k], tree[2 * k + 1])
        self._size, self._tree, self._n = size, tree, len(values)

    def find(self, i: int, x: float) -> int | None:
        if i >= self._n:
            return None
        tree, k = self._tree, i + self._size
        while tree[k] < x:  # on to the next subtree to the right
            while k & 1:
                k >>= 1
            if not k:
                return None
            k += 1
        while k < self._size:  # down to its first leaf that is large enough
            k = 2 * k if tree[2 * k] >= x else 2 * k + 1
        return k - self._size


class Inside:
    """Numbers grouped by module (any hashable key), asked about with some modules left out:
    the largest one, and whether one lies strictly between two bounds."""

    def __init__(self, values: Iterable[tuple[Hashable, float]]) -> None:
        self._by_key: dict[Hashable, list[float]] = {}
        for key, value in values:
            self._by_key.setdefault(key, []).append(value)
        for found in self._by_key.values():
            found.sort()
        self._all = sorted(v for found in self._by_key.values() for v in found)
        # the modules by their largest number, largest first
        self._tops = sorted(((found[-1], key) for key, found in self._by_key.items()),
                            key=lambda t: -t[0])

    def __contains__(self, key: Hashable) -> bool:
        return key in self._by_key

    def largest(self, left_out: Collection[Hashable]) -> float:
        """The largest number of a module not left out (0.0: none)."""
        return next((top for top, key in self._tops if key not in left_out), 0.0)

    def between(self, low: float, high: float, left_out: Collection[Hashable]) -> bool:
        """A number of a module not left out lies in (low, high)."""
        count = bisect_left(self._all, high) - bisect_right(self._all, low)
        for key in left_out:
            found = self._by_key.get(key)
            if found:
                count -= bisect_left(found, high) - bisect_right(found, low)
        return count > 0


class Enclosing:
    """The calls enclosing a call: for each ancestor module (by fqn), its first call to return
    after the call returned (a parent returns after its children). Indexed once per step (the
    calls of each module by seq), so that a step of many calls costs a log each."""

    def __init__(self, calls: list[JudgedCall], trainable: Callable[[ModelFqn], bool]) -> None:
        self._by_key: dict[ModelFqn, list[JudgedCall]] = {}
        for c in calls:
            self._by_key.setdefault(c.key, []).append(c)
        self._seqs = {key: [c.seq for c in found] for key, found in self._by_key.items()}
        self._fed = {key: sum(c.fed for c in found) for key, found in self._by_key.items()}
        self._names = sorted(key[1] for key in self._by_key)  # of the step's model
        self._at = {c.seq: c for c in calls}
        self._chains: dict[int, list[JudgedCall]] = {}
        # per module: its ancestors that ran in the step, innermost first (seqs, calls)
        self._above: dict[ModelFqn, list[tuple[list[int], list[JudgedCall]]]] = {}
        self._inside: dict[int, Inside] = {}
        self._lineages: dict[tuple[int, ModelFqn], tuple[set[ModelFqn], float]] = {}
        self._trainable = trainable
        # before the i-th call: the largest g_out of a fed call with parameters
        self._call_seqs, self._before = [c.seq for c in calls], []
        top: float | None = None
        for c in calls:
            self._before.append(top)
            if c.fed and c.g_out is not None and trainable(c.key):
                top = c.g_out if top is None else max(top, c.g_out)
        self.largest = top or 0.0  # of them all: no call inside any forward got more

    def chain(self, v: JudgedCall) -> list[JudgedCall]:
        """Innermost first."""
        out = self._chains.get(v.seq)
        if out is None:
            above = self._above.get(v.key)
            if above is None:
                model = v.key[0]
                above = self._above[v.key] = [
                    (self._seqs[(model, name)], self._by_key[(model, name)])
                    for name in reversed(ancestors(v.key[1])) if (model, name) in self._by_key]
            out = self._chains[v.seq] = []
            for seqs, found in above:
                i = bisect_right(seqs, v.seq)
                if i < len(found):
                    out.append(found[i])
        return out

    def fed_elsewhere(self, v: JudgedCall) -> bool:
        """Another call of ``v``'s module in the step got a gradient."""
        return self._fed.get(v.key, 0) - (v.fed and self._at.get(v.seq) is v) > 0

    def largest_before(self, b: JudgedCall) -> float | None:
        """The largest gradient (``g_out``) of a fed call with parameters before ``b``."""
        return self._before[bisect_left(self._call_seqs, b.seq)]

    def inside(self, outer: JudgedCall) -> Inside:
        """The gradients of the fed calls with parameters whose chain holds ``outer``: in its
        forward (after the call of its module before it), of a module below it. By module."""
        found = self._inside.get(outer.seq)
        if found is None:
            seqs = self._seqs[outer.key]
            i = bisect_left(seqs, outer.seq)
            after = seqs[i - 1] if i else -math.inf
            values = []
            for name in self._below(outer.key[1]):
                key = (outer.key[0], name)
                if not self._trainable(key):
                    continue
                calls, at = self._by_key[key], self._seqs[key]
                for c in calls[bisect_right(at, after):bisect_left(at, outer.seq)]:
                    if c.fed and c.g_out:
                        values.append((key, c.g_out))
            found = self._inside[outer.seq] = Inside(values)
        return found

    def _below(self, name: str) -> list[str]:
        """The step's modules inside ``name``'s (its descendants), from the sorted names."""
        if not name:
            return [n for n in self._names if n]
        prefix = name + "."
        out = []
        for n in self._names[bisect_left(self._names, prefix):]:
            if not n.startswith(prefix):
                break
            out.append(n)
        return out

    def lineage(self, outer: JudgedCall, v: JudgedCall) -> tuple[set[ModelFqn], float]:
        """The modules of ``inside(outer)`` that hold ``v``'s module, are it, or lie in it;
        and the largest gradient inside ``outer`` of a module that does not (0.0: none)."""
        found = self._lineages.get((outer.seq, v.key))
        if found is None:
            inside, (model, name) = self.inside(outer), v.key
            lineage = {(model, n) for n in [*ancestors(name), name, *self._below(name)]
                       if (model, n) in inside}
            found = self._lineages[(outer.seq, v.key)] = (lineage, inside.largest(lineage))
        return found

    def outermost(self, v: JudgedCall) -> JudgedCall | None:
        chain = self.chain(v)
        return chain[-1] if chain else None

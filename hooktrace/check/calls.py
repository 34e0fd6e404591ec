"""One forward call of a step that ``flow`` judges, what its backward received and gave, and what
that says (whether it passes back nothing, whom it starves, the chance a drop layer drops it all);
and the indexes that answer flow's per-call questions in log time. Asked by scanning, an unrolled
loop (an ``LSTMCell`` called 999 times in one step) costs the square of its calls; these answer
the same questions from numbers gathered once per step."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hooktrace.log.gradstat import norm
from hooktrace.log.names import ancestors
from hooktrace.log.schema import DropUnit

if TYPE_CHECKING:
    from hooktrace.check.keys import ModelFqn


@dataclass(slots=True)
class JudgedCall:
    """One forward call of a judged step, and what its backward received and gave."""

    step: int
    seq: int
    key: ModelFqn
    call: int
    grad: bool  # ran with gradient recording on
    backed: bool = False  # its backward ran
    eval_mode: bool = False  # its module was in eval mode (``model.eval()``)
    g_out: float | None = None  # norm of the gradients reaching its outputs (None: unknown)
    g_in: float | None = None  # norm of the gradients of its inputs (None: none flowed)
    lost: bool = False  # an input that needed a gradient got none
    finite: bool = True
    unit_last: bool = False  # its first output's last dim has size 1
    chance: float | None = None  # a random-drop layer's: that it drops its whole input
    half: bool = False  # its outputs are float16 (where gradients below 6e-8 round to 0)
    out_shapes: Sequence[object] | None = None  # its outputs' shapes (the forward event's)
    # the share of exactly-zero elements in the gradients reaching its outputs, where some
    # are and some are not (a module with children; None: not known, or none or all of them)
    zeros: float | None = None
    zero_outs: tuple[int, ...] = ()  # its outputs whose gradient is exactly zero
    unread_outs: tuple[int, ...] = ()  # its outputs no gradient reached, where another's did
    after: int = -1  # the seq of the forward call that returned just before it in the step
    # something without autograd history went into its outputs (``made_no_history``), so a
    # call inside it may have made them without a gradient back; None: the log does not say
    # (a log from before it, or with fqn filters: calls not traced may run between)
    made_no_history: bool | None = None

    def gradients(self, outs: Sequence[Sequence[float] | None] | None,
                  ins: Sequence[Sequence[float] | None] | None) -> None:
        """Its backward's statistics (``[norm, absmax, ...]`` per tensor) into norms. A call
        that was fed keeps that: its backward runs again, with other numbers, when a later pass
        goes back through its gradient's graph (a gradient penalty, ``create_graph=True``,
        where a ReLU's second derivative is exactly zero)."""
        if self.fed:
            return
        self.backed = True
        self.g_out, self.g_in = norm(outs), norm(ins)
        if outs is not None and len(outs) > 1:
            self.zero_outs = tuple(i for i, s in enumerate(outs) if s is not None and s[0] == 0)
            self.unread_outs = tuple(i for i, s in enumerate(outs) if s is None)
        self.finite = all(n is None or math.isfinite(n) for n in (self.g_out, self.g_in))

    @property
    def fed(self) -> bool:
        """It received a usable gradient: finite, not zero (or of unknown size: no stats)."""
        return self.backed and self.finite and (self.g_out is None or self.g_out > 0)

    @property
    def dead(self) -> bool:
        return not self.backed or (self.finite and self.g_out == 0)


def take_zero_shares(judged: dict[int, JudgedCall], share: object) -> None:
    """A ``grad-zeros`` signal's ``share`` (call seq -> the share of exactly-zero gradient at
    its outputs) into the calls being judged."""
    if not isinstance(share, dict) or not judged:
        return
    for seq, value in share.items():
        call = judged.get(int(seq)) if isinstance(seq, str) and seq.isdigit() else None
        if call is not None and isinstance(value, (int, float)):
            call.zeros = float(value)


def whole_drop(p: float, unit: str, inputs: Sequence[object]) -> float | None:
    """The chance that a drop layer of probability ``p`` drops every value of its input
    (``inputs``: the shapes of its tensor inputs), one draw per ``unit``; None: unknown."""
    shape = inputs[0] if inputs else None
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        return None
    if p >= 1 or unit == DropUnit.BATCH:
        return min(p, 1.0)
    leading = {DropUnit.SAMPLE: 1, DropUnit.CHANNEL: 2}.get(unit)  # dims a draw covers; else all
    draws = math.prod(shape[:leading])
    return float(p ** draws) if draws else 1.0


def starves(b: JudgedCall, v: JudgedCall) -> bool:
    """``v``'s gradient is as small as what ``b`` passes back, far below what ``b`` receives
    (unknown sizes, a lost input's among them, say nothing)."""
    if b.g_out is None or b.g_in is None or v.g_out is None:
        return False
    return v.g_out <= 1e3 * b.g_in and v.g_out < 1e-3 * b.g_out


def reach(b: JudgedCall) -> float:
    """``starves(b, v)`` needs ``v.g_out`` at most this (-inf: ``b`` starves nothing)."""
    if b.g_out is None or b.g_in is None:
        return -math.inf
    return min(1e3 * b.g_in, 1e-3 * b.g_out)


def passes_nothing(b: JudgedCall) -> bool:
    return b.lost or b.g_in == 0


def only_looked_at(outer: JudgedCall, branch: JudgedCall) -> bool:
    """``branch``, a call inside ``outer``'s forward without backward, is the last call to
    return before ``outer`` did, and nothing without autograd history went into ``outer``'s
    outputs: no traced call can have read ``branch``'s output, and ``outer``'s outputs, which
    got a gradient, hold none of it. Its result was only looked at (``float(body(x).norm())``,
    kept for a log); not a call whose detached output a later call reads (a siamese head) or
    that is added into ``outer``'s output (``a + enc(x2).detach()``)."""
    return outer.made_no_history is False and outer.after == branch.seq


def passes_zero(outer: JudgedCall, branch: JudgedCall) -> bool:
    """``outer`` returns ``branch``'s output and the gradient of that output is exactly zero,
    while another of its outputs got one."""
    return _returns(outer, branch, outer.zero_outs)


def returned_unread(outer: JudgedCall, branch: JudgedCall) -> bool:
    """``outer`` returns ``branch``'s output and no gradient reached that output, while another
    of its outputs got one, and nothing without autograd history went into its outputs (not a
    ``.detach()``ed result returned): the caller let it go (DANN's label logits of the
    unlabelled target batch), not a result thrown away inside a forward."""
    return outer.made_no_history is False and _returns(outer, branch, outer.unread_outs)


def _returns(outer: JudgedCall, branch: JudgedCall, outs: tuple[int, ...]) -> bool:
    """One of ``outs`` of ``outer`` is ``branch``'s output: an output of the same shape."""
    shapes = outer.out_shapes
    if not outs or not branch.out_shapes or not shapes:
        return False
    return any(i < len(shapes) and shapes[i] == branch.out_shapes[0] for i in outs)


class Judging:
    """The calls of the first ``steps`` steps, judged call by call: by forward seq (``by_seq``,
    what a backward event names) and by (step, module index, call index), for the backward of
    a recomputed call. ``says_history``: the log's forward events say what went into their
    outputs without history, and every module is traced."""

    def __init__(self, steps: int, says_history: bool) -> None:
        self.by_seq: dict[int, JudgedCall] = {}
        self.on = False  # the forward calls' step is judged
        self._by_call: dict[tuple[int, int, int], JudgedCall] = {}
        self._steps: set[int] = set()
        self._limit = steps
        self._says_history = says_history

    def start(self, step: int) -> None:
        """The forward calls are now of ``step``."""
        if step not in self._steps and len(self._steps) < self._limit:
            self._steps.add(step)
        self.on = step in self._steps

    def recompute(self, step: int, seq: int, index: int, call: int) -> None:
        """A recompute's backward is the original call's."""
        original = self._by_call.get((step, index, call))
        if original is not None:
            self.by_seq[seq] = original

    def add(self, call: JudgedCall, index: int, drop: tuple[float, str] | None,
            ins: Sequence[object], no_history: bool) -> None:
        """``call`` judged; ``drop``: its module's, ``ins``: its inputs' shapes."""
        call.chance = None if drop is None else whole_drop(*drop, ins)
        call.made_no_history = no_history if self._says_history else None
        self.by_seq[call.seq] = self._by_call[(call.step, index, call.call)] = call

    def calls(self) -> list[JudgedCall]:
        return list(self._by_call.values())


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

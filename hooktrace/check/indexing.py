"""The indices a ``collect.Collector`` keeps while it reads: modules as small integers, the step
of each recent forward call, per-step sets of modules (one object per distinct set), and the
distinct sequences of calls a loop repeats (``Patterns``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hooktrace.check.collected import LossCall, ModuleStats
from hooktrace.check.losses import LOSSES
from hooktrace.log import schema

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn, ModelFqns
    from hooktrace.log.decoder import Signature
    from hooktrace.log.reader import LogReader

Indices = frozenset[int]  # of module keys (Collector._keys): cheap to hash, unlike keys

_PATTERNS = 1000  # counted sequences of calls kept; a model whose steps all differ cycles them


class Modules:
    """Each module key as an index (cheap to hash, unlike keys), and the log's module ids as
    those indices (an id may name another module after a module record)."""

    def __init__(self, reader: LogReader, c: Collected) -> None:
        self.keys: list[ModelFqn] = []  # an index -> its key
        self.of_id: dict[int, int] = {}  # cleared by every module record
        self.trainable: set[int] = set()
        self.losses: set[int] = set()  # loss modules not yet called
        self._of_key: dict[ModelFqn, int] = {}
        self._reader = reader
        self._c = c

    def take(self, r: schema.Module) -> None:
        """A module record: its ``ModuleStats`` (the first record of its key's)."""
        self._c.names.take(r)
        m = self._c.modules.setdefault((r.model, r.fqn), ModuleStats(
            r.model, r.fqn, r.cls, r.params, r.trainable, loose=tuple(r.loose or ()),
            drop=None if r.drop is None else (r.drop, r.drop_unit or schema.DropUnit.ELEMENT),
            wrapper=r.wrapper, aliases=tuple(r.aliases or ()), alias_of=r.alias_of))
        if m.trainable:
            self.trainable.add(self.index((r.model, r.fqn)))
        if r.cls in LOSSES:
            self.losses.add(self.index((r.model, r.fqn)))
        self.of_id.clear()

    def loss_call(self, step: int, index: int, ins: Signature,
                  before: Sequence[int | None]) -> None:
        """A loss module's first call: its inputs' shapes and what it took them from (the
        two calls ``before`` it: a model's root just after one of its modules)."""
        self.losses.discard(index)
        keys = [self.keys[i] for i in before if i is not None]
        model_last = len(keys) == 2 and keys[1][1] == "" and keys[0][0] == keys[1][0]
        self._c.losses[self.keys[index]] = LossCall(step, list(ins[0]),
                                                    keys[0] if model_last else None)

    def index(self, key: ModelFqn) -> int:
        index = self._of_key.get(key)
        if index is None:
            index = self._of_key[key] = len(self.keys)
            self.keys.append(key)
        return index

    def of(self, ident: int) -> int:
        """The index of a module id, the first time it is used since a module record."""
        index = self.of_id[ident] = self.index(self._reader.modules[ident])
        return index

    def stats(self, index: int) -> ModuleStats:
        """The module of an index (one made inside forward has no module record: made here)."""
        key = self.keys[index]
        m = self._c.modules.get(key)
        if m is None:
            m = self._c.modules[key] = ModuleStats(key[0], key[1], "?")
        return m


class StepSets:
    """Per step, the modules that ran with gradients on, under no_grad, in eval mode, and got a
    backward, as sets of indices; one object per distinct set (a loop repeats one step)."""

    def __init__(self) -> None:
        self.grad: dict[int, Indices] = {}
        self.no_grad: dict[int, Indices] = {}
        self.eval_mode: dict[int, Indices] = {}
        self.backward: dict[int, Indices] = {}
        self._interned: dict[Indices, Indices] = {}

    def add(self, sets: dict[int, Indices], step: int, indices: Indices) -> None:
        if indices:
            old = sets.get(step)
            new = indices if old is None else old | indices
            sets[step] = self._interned.setdefault(new, new)

    def into(self, c: Collected, keys: Sequence[ModelFqn]) -> None:
        """The sets as module keys, into ``c``."""
        as_keys: dict[Indices, ModelFqns] = {}
        for sets, out in ((self.grad, c.grad), (self.no_grad, c.no_grad),
                          (self.eval_mode, c.eval_mode), (self.backward, c.backward)):
            for step, indices in sets.items():
                if indices not in as_keys:
                    as_keys[indices] = frozenset(keys[i] for i in indices)
                out[step] = as_keys[indices]


class ForwardSteps:
    """The step of each recent forward call, by its seq: a backward event names its forward
    call, paired within a step or two (a GAN's generator); older ones are forgotten."""

    def __init__(self) -> None:
        self.step_of: dict[int, int] = {}
        self._recent: list[tuple[int, list[int]]] = []  # (step, its forward seqs)
        self.indexed = 0  # how many of the step's seqs are here (the reader resets it)

    def add(self, step: int | None, seqs: list[int]) -> None:
        """The step's forward seqs (all of them so far) not yet here."""
        if self.indexed < len(seqs) and step is not None:
            new = seqs[self.indexed:]
            self.step_of.update(dict.fromkeys(new, step))
            self._recent.append((step, new))
            self.indexed = len(seqs)

    def prune(self, step: int) -> None:
        kept = []
        for at, seqs in self._recent:
            if at >= step - 2:
                kept.append((at, seqs))
                continue
            for seq in seqs:
                if self.step_of.get(seq) == at:  # not since given to a later step
                    del self.step_of[seq]
        self._recent[:] = kept


def order_break(seqs: Sequence[int], calls: Sequence[int | None], backward: Sequence[int]
                ) -> int | None:
    """The index of the last module whose backward comes out of the reverse of the step's
    forward order (``seqs`` and ``calls``: the forward's; ``backward``: its backward events'
    forward seqs), or None when the backward mirrors the forward."""
    if len(calls) == len(seqs) and None not in calls:
        called = set(seqs)  # the usual: every forward was a call
    else:
        called = {s for s, i in zip(seqs, calls, strict=False) if i is not None}
    order = list(filter(called.__contains__, backward))
    mirrored = sorted(set(order), reverse=True)  # seqs grow in forward order
    got = next((g for g, e in zip(order, mirrored, strict=False) if g != e), None) \
        if order != mirrored else None
    if got is None:
        return None
    return next(i for s, i in zip(reversed(seqs), reversed(calls), strict=True)
                if s == got and i is not None)


class Profiles:
    """Per backward step, the trainable modules' parameter-gradient norms in backward order, and the
    parameter-gradient records, as tuples (lists would be scanned by every garbage collection), one
    object per distinct tuple of names."""

    def __init__(self, c: Collected) -> None:
        self.modules: list[ModelFqn] = []  # the profile of the step being read, so far
        self.norms: list[float] = []
        self._interned: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._c = c

    def keep(self, step: int) -> None:
        """The step's profile, after the part of it read before if the log came back to it."""
        modules, norms = tuple(self.modules), tuple(self.norms)
        if step in self._c.profiles:
            before, before_norms = self._c.profiles[step]
            modules, norms = before + modules, before_norms + norms
        self._c.profiles[step] = (self._interned.setdefault(modules, modules), norms)
        self.modules.clear()
        self.norms.clear()

    def params(self, r: schema.ParamGrads) -> None:
        names = tuple(r.grad_norm)
        self._c.param_norms.setdefault(r.step, []).append(
            (r.model, self._interned.setdefault(names, names), tuple(r.grad_norm.values())))


@dataclass(slots=True)
class Pattern:
    """One step's forward calls, counted; ``runs``: the steps that made exactly these calls."""

    calls: dict[int, int]
    #: the calls with gradient recording on in train mode (not a validation pass); for a
    #: module whose such calls all ran in eval mode, those (training in eval mode, or a pass
    #: with gradients on that ``eval_mode`` names)
    grad_calls: dict[int, int]
    grad: Indices
    no_grad: Indices
    eval_mode: Indices = frozenset()  # the modules whose calls in ``grad`` all ran in eval mode
    runs: int = 0


class Patterns:
    """The distinct sequences of calls seen since the last ``flush``."""

    def __init__(self, module: Callable[[int], ModuleStats]) -> None:
        self._module = module
        self._patterns: dict[tuple[Any, ...], Pattern] = {}

    def count(self, calls: list[int | None], no_grad_calls: list[int], seqs: list[int],
              eval_calls: Sequence[int] = ()) -> Pattern:
        """One step's forward calls (None: a recompute), those without gradient recording,
        their seqs, and those in eval mode with gradient recording on."""
        key = (tuple(calls), tuple(no_grad_calls), tuple(eval_calls))
        pattern = self._patterns.get(key)
        if pattern is None:  # new calls: the first call of a module may be among them
            if len(self._patterns) >= _PATTERNS:
                self.flush()
            counts = Counter(i for i in calls if i is not None)
            for seq, index in zip(seqs, calls, strict=True):
                m = self._module(index) if index is not None else None
                if m is not None and m.first_seq is None:
                    m.first_seq = seq
            grad_calls = counts - Counter(no_grad_calls)
            evaluated = Counter(eval_calls)
            trained = grad_calls - evaluated
            eval_only = frozenset(evaluated) - frozenset(trained)
            pattern = self._patterns[key] = Pattern(
                dict(counts), {**trained, **{i: evaluated[i] for i in eval_only}},
                frozenset(grad_calls), frozenset(no_grad_calls), eval_only)
        pattern.runs += 1
        return pattern

    def flush(self) -> None:
        """Add the calls of the counted steps to their modules, and forget the patterns."""
        for pattern in self._patterns.values():
            for index, n in pattern.calls.items():
                m = self._module(index)
                m.calls += n * pattern.runs
                m.max_calls_per_step = max(m.max_calls_per_step, pattern.grad_calls.get(index, 0))
        self._patterns.clear()

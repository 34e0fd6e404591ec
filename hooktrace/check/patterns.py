"""A training loop's forward calls, counted once per distinct sequence of calls in a step.

A loop repeats one step: ``collect`` hands each step's calls (module indices) to ``Patterns``,
which counts a sequence the first time it sees it and only adds a run after that. ``flush``
adds the counted calls to their modules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hooktrace.check.collected import ModuleStats

Indices = frozenset[int]  # of module keys (Collector._keys): cheap to hash, unlike keys

_PATTERNS = 1000  # counted sequences of calls kept; a model whose steps all differ cycles them


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
    """The distinct sequences of calls seen since the last ``flush``. ``module``: the stats of
    the module of an index."""

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

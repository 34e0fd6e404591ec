"""What ``flow`` finds: each boundary module where gradient is lost (its cause, the steps, the
starved modules it explains), and the whole of them for one log, with what tells a random drop
layer's chance from a bug. Plain data: ``flow`` fills it, ``causes`` words it, the detectors
that know a training loop (turns, evaluation copies, freezes) take victims out of it."""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hooktrace.check.keys import ModelFqn


@dataclass
class Boundary:
    """One module where gradient is lost, over the judged steps."""

    key: ModelFqn
    cause: str  # a key of causes.CAUSES
    steps: list[int] = field(default_factory=list)
    victims: dict[ModelFqn, None] = field(default_factory=dict)
    # for a cause inside a forward: its children whose outputs starve
    branches: dict[str, None] = field(default_factory=dict)
    g_out: float | None = None  # at the first step
    g_in: float | None = None
    # inside a forward: the largest ratio of a starved child's gradient to a sibling's, where
    # it was not exactly zero (None: zero at every step)
    ratio: float | None = None
    exact: bool = False  # and exactly zero at some step
    drops: dict[int, None] = field(default_factory=dict)  # a drop layer's: the calls (seq)
    # for "selected": the calls whose outputs the loss reads in part, and the share of their
    # gradient that is exactly zero
    reads: dict[str, float] = field(default_factory=dict)


@dataclass
class GradientFlow:
    """The boundaries found, and the modules they explain (no other finding needs them)."""

    boundaries: dict[tuple[ModelFqn, str], Boundary] = field(default_factory=dict)
    judged: dict[int, list[int]] = field(default_factory=dict)  # per model, its judged steps
    # per random-drop layer: its calls that received a gradient, and the largest chance
    # one of them had to drop its whole input
    draws: dict[ModelFqn, tuple[int, float]] = field(default_factory=dict)

    @property
    def victims(self) -> set[ModelFqn]:
        return {v for b in self.boundaries.values() for v in b.victims}

    def drop_victims(self, keys: set[ModelFqn],
                     causes: Container[str] | None = None) -> None:
        """``keys`` are no victims of a boundary (of one of ``causes``, else of any): modules
        that a training loop explains (trained in turns, an evaluation copy). A boundary they
        leave with none is none."""
        for bkey, b in list(self.boundaries.items()):
            gone = keys.intersection(b.victims)
            if gone and (causes is None or b.cause in causes):
                for key in gone:
                    del b.victims[key]
                if not b.victims:
                    del self.boundaries[bkey]

    def by_chance(self, b: Boundary) -> float | None:
        """For a drop layer's whole drops: a bound on the probability that its own drop
        probability makes as many in the calls judged (None: its probability is unknown; 0: it
        is 1, which drops every input, a bug whatever the odds)."""
        draws = self.draws.get(b.key)
        if b.cause != "dropped" or draws is None or not b.drops:
            return None
        n, q = draws
        if q >= 1:
            return 0.0
        k = min(len(b.drops), n)
        return min(1.0, math.comb(n, k) * q ** k)

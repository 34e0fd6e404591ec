"""A regression loss whose target carries a gradient into the model it trains, through a max
over that model's output: a bootstrapped target (``r + gamma * q(s').max(1).values``) computed
with gradient, so the loss also moves its own target (DQN without ``no_grad`` or a target
network). Read from the loss's autograd node as ``backward()`` begins (``lossterms.py``
finds the loss calls); the graph is only read.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from hooktrace.hooks.gradhooks import output_calls

_BUDGET = 32  # nodes looked at from each side of the loss
#: autograd ops (node names without ``Backward<n>``) that take a max over an output
_MAXES = frozenset({"Max", "Amax", "Logsumexp"})


class Side(NamedTuple):
    models: frozenset[int]  # the models with parameters whose calls' outputs it reached
    calls: frozenset[int]  # those calls (their forward seqs)
    through: str  # the max it went through before the first call reached ("" if none)


def _name(node: Any) -> str:
    name = type(node).__name__
    cut = name.rfind("Backward")
    return name[:cut] if cut > 0 else name


def side(node: Any) -> Side:
    """From one input of a loss back to the first traced calls' outputs on each path."""
    models: set[int] = set()
    calls: set[int] = set()
    through = ""
    seen = {node}
    queue = deque([(node, "")])
    while queue and len(seen) < _BUDGET:
        n, maxed = queue.popleft()
        found = [c for c in output_calls(n) if c.info is not None and c.info.has_params]
        if found:
            models.update(c.info.model for c in found)
            calls.update(c.seq for c in found)
            through = through or maxed
            continue
        op = _name(n)
        maxed = maxed or (op if op in _MAXES else "")
        for child, _ in n.next_functions:
            if child is not None and child not in seen and \
                    type(child).__name__ != "AccumulateGrad":
                seen.add(child)
                queue.append((child, maxed))
    return Side(frozenset(models), frozenset(calls), through)


def bootstrapped(loss: Any) -> tuple[int, str] | None:
    """The model (and the max) where the target side of ``loss`` (its second input) reaches,
    through a max, another call of a model its input side reaches; None otherwise."""
    edges = loss.next_functions
    if len(edges) < 2 or edges[0][0] is None or edges[1][0] is None:
        return None
    pred, target = side(edges[0][0]), side(edges[1][0])
    shared = pred.models & target.models
    if not shared or not target.through or not (target.calls - pred.calls):
        return None
    return min(shared), target.through

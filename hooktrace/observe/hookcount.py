"""Hooks that pile up: per module, its own hooks and its parameters' gradient hooks, counted at
the end of each recorded step; a count that grew at each of the last ``GROWTHS`` looks is said
in a ``hooks-growing`` signal, once per module and kind.

A hook registered in the loop and never removed (``p.register_hook`` or
``register_forward_hook`` per step) adds one each step: the gradient is scaled once more, a
feature list gets the output once more. A hook registered once, or per epoch and removed, does
not grow at every look. Cost: a few attribute reads per module a recorded step (the dicts
PyTorch keeps the hooks in: ``_forward_hooks``, ``_forward_pre_hooks``, ``_backward_hooks``,
``_backward_pre_hooks``; a parameter's ``_backward_hooks`` and
``_post_accumulate_grad_hooks``), nothing in other steps.
"""

from __future__ import annotations

import itertools

from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

GROWTHS = 2  # a count that grew at this many looks in a row
KINDS = ("forward", "backward", "gradient")


def hook_counts(module: nn.Module) -> tuple[int, int, int]:
    """The module's forward, module backward and own parameters' gradient hooks."""
    forward = len(module._forward_hooks) + len(module._forward_pre_hooks)
    backward = len(module._backward_hooks) + len(module._backward_pre_hooks)
    gradient = 0
    for p in module._parameters.values():
        if p is not None:
            hooks, after = p._backward_hooks, p._post_accumulate_grad_hooks
            gradient += (len(hooks) if hooks else 0) + (len(after) if after else 0)
    return forward, backward, gradient


class HookCount(Observer):
    """Counts each module's hooks at the end of every recorded step."""

    follows = ()  # no module call: the step's end looks at every module seen

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        # per module seen, in the order first seen: the steps looked at and the counts then,
        # while each kind grows
        self._history: dict[ModInfo, list[tuple[int, tuple[int, int, int]]]] = {}
        self._said: set[tuple[ModInfo, str]] = set()

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        self._history.setdefault(info, [])

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is not Mode.RECORDED:
            return
        for info, history in list(self._history.items()):
            module = info.ref()
            if module is None:
                del self._history[info]
            else:
                self._look(end.step, info, history, hook_counts(module))

    def _look(self, step: int, info: ModInfo, history: list[tuple[int, tuple[int, int, int]]],
              now: tuple[int, int, int]) -> None:
        if history and history[-1][0] == step:
            history.pop()  # several passes in one step: its last
        history.append((step, now))
        del history[:-(GROWTHS + 1)]
        if len(history) <= GROWTHS:
            return
        for k, kind in enumerate(KINDS):
            seen = [c[k] for _, c in history]
            if (info, kind) in self._said or not all(
                    a < b for a, b in itertools.pairwise(seen)):
                continue
            self._said.add((info, kind))
            self._emit(schema.Signal(
                history[0][0], info.model, info.fqn, SignalKind.HOOKS_GROWING, {
                "hooks": kind, "counts": seen, "steps": [s for s, _ in history]}))

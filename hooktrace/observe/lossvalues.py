"""The loss ledger's values: the value each backward pass starts from, in every step (recorded
and watched), by the models the pass reached (a GAN's two losses apart), written when tracing
stops as one ``loss-values`` signal per group of models.

A value is kept on its device as backward begins (a detached copy of a one-element root) and
read in one transfer per ``_BATCH`` passes, never a device sync per step. A long run keeps a
bounded sample: past ``_KEEP`` values the ledger keeps every other one and samples half as
often, so its values stay evenly spread over the run; the last pass's value is always kept.
Facts only: whether the loss diverges is ``check``'s to say.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from hooktrace.hooks.records import Emit, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

_KEEP = 256  # values kept per group of models, at most
_BATCH = 64  # values held on their devices before one read


class Thinned:
    """A bounded sample of (key, value) pairs in arrival order: past ``_KEEP`` pairs every other
    one is dropped and one pair in ``every`` is taken, so the sample stays evenly spread over
    the run; the last pair is always among ``pairs()``. The loss ledger's values and the
    optimizers' learning rates (``ledger.Lrs``) are sampled so."""

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.values: list[Any] = []
        self.every = 1
        self.count = 0
        self.last: tuple[int, Any] | None = None

    def add(self, key: int, value: Any) -> None:
        self.last = (key, value)
        if self.count % self.every == 0:
            self.keys.append(key)
            self.values.append(value)
            if len(self.values) > _KEEP:
                self.keys, self.values = self.keys[::2], self.values[::2]
                self.every *= 2
        self.count += 1

    def pairs(self) -> tuple[list[int], list[Any]]:
        keys, values = list(self.keys), list(self.values)
        if self.last is not None and (self.count - 1) % self.every:  # the last, not sampled
            keys.append(self.last[0])
            values.append(self.last[1])
        return keys, values


_Method = TypeVar("_Method", bound=Callable[..., None])


def _quiet_on_error(method: _Method) -> _Method:
    """An exception never reaches the program, nor the loss graph that holds the ledger: the
    ledger goes quiet, and writes nothing."""
    @functools.wraps(method)
    def guarded(self: LossValues, *args: Any) -> None:
        if self._off:
            return
        try:
            method(self, *args)
        except Exception:
            self._off = True
            self._held.clear()
            self._ledgers.clear()
    return guarded  # type: ignore[return-value]


class LossValues:
    """Held by the loss graph's ``backward()`` wrapper: ``began`` as an outermost pass starts,
    ``ended`` at its end (the core's ``PassEnd``), ``write`` when tracing stops."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._off = False
        self._root: torch.Tensor | None = None  # the pass now running's
        self._held: list[tuple[tuple[int, ...], int, torch.Tensor]] = []
        self._ledgers: dict[tuple[int, ...], Thinned] = {}

    @_quiet_on_error
    def began(self, tensors: Any) -> None:
        root = tensors[0] if isinstance(tensors, list | tuple) and tensors else tensors
        self._root = (root.detach().clone() if isinstance(root, torch.Tensor)
                      and root.numel() == 1 else None)

    @_quiet_on_error
    def ended(self, end: PassEnd) -> None:
        root, self._root = self._root, None
        if root is None or not end.reached:
            return
        models = tuple(sorted({info.model for info in end.reached}))
        self._held.append((models, end.step, root))
        if len(self._held) >= _BATCH:
            self._read()

    @_quiet_on_error
    def write(self) -> None:
        self._read()
        for models, ledger in sorted(self._ledgers.items()):
            steps, values = ledger.pairs()
            self._emit(schema.Signal(steps[0], models[0], "", SignalKind.LOSS_VALUES, {
                "models": list(models), "steps": steps, "values": values,
                "passes": ledger.count, "every": ledger.every}))

    def _read(self) -> None:
        held, self._held = self._held, []
        if not held:
            return
        try:  # one transfer where the values share a device and dtype
            values = torch.stack([t.reshape(()).float() for _, _, t in held]).tolist()
        except RuntimeError:
            values = [t.item() for _, _, t in held]
        for (models, step, _), value in zip(held, values, strict=True):  # 4 digits, as stats
            self._ledgers.setdefault(models, Thinned()).add(step, float(f"{value:.4g}"))

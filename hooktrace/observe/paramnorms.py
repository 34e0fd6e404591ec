"""Parameter-gradient norms observer: one ``params`` record per model and recorded step, and a
``params-without-grad`` signal where a module's own parameters got a gradient in part."""

from __future__ import annotations

import itertools
from itertools import compress
from operator import attrgetter
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.stats import TensorStats

_has_params = attrgetter("has_params")


class ParamNorms(Observer):
    """Norms of the parameter gradients of the modules that took part in a recorded step; and
    of modules never called so far whose parameters got a gradient anyway (a parent uses them
    directly, as MultiheadAttention does its out_proj's): not unused, though never called.
    Without statistics (``stats`` None), only the latter (a rare few, read at once).

    A module some of whose trainable parameters got a gradient while others got none (a weight
    read through ``.data``) is said in a ``params-without-grad`` signal, when what it has
    without one changes: found in the same walk over the parameters, at no cost otherwise."""

    follows = ()  # no module call: the step's end names the modules that took part

    def __init__(self, stats: TensorStats | None, uncalled: dict[ModInfo, None],
                 emit: Emit) -> None:
        self._stats = stats
        self._uncalled = uncalled  # the naming's: traced modules with parameters never called
        self._emit = emit
        # modules said to have parameters without a gradient: their names, as last said
        self._partial: dict[ModInfo, list[str]] = {}

    def backward_end(self, end: PassEnd) -> None:
        if end.mode is Mode.RECORDED:
            # the modules with parameters called in the step, or whose backward began in it
            infos = end.called + end.reached
            step_params = dict.fromkeys(compress(infos, map(_has_params, infos)))
            signals: list[schema.Signal] = []
            for record in self._norms(end.step, step_params, signals):
                self._emit(record)
            for signal in signals:
                self._emit(signal)

    def _norms(self, step: int, step_params: dict[ModInfo, None],
               signals: list[schema.Signal]) -> list[schema.ParamGrads]:
        uncalled = self._uncalled
        if uncalled:
            for info in step_params:
                uncalled.pop(info, None)
            for info in [info for info in uncalled if info.ref() is None]:
                del uncalled[info]  # its model is gone
        if self._stats is None and not uncalled:
            return []
        records: dict[int, schema.ParamGrads] = {}
        groups: list[tuple[dict[str, Any], str, list[torch.Tensor]]] = []
        called = step_params if self._stats is not None else {}
        partial = self._partial
        for info in itertools.chain(called, uncalled):
            module = info.ref()
            if module is None:
                continue
            # _parameters, not parameters(recurse=False): the generator costs more than the norm
            trainable = [p for p in module._parameters.values()
                         if p is not None and p.requires_grad]
            if not trainable:
                continue  # frozen: the module record says so
            grads = [p.grad for p in trainable if p.grad is not None]
            if not grads and info in uncalled:
                continue  # not called, no gradient: unused, as the module records tell
            if grads and (len(grads) < len(trainable) or (partial and info in partial)):
                self._without_grad(step, info, module, signals)
            record = records.get(info.model)
            if record is None:
                record = records[info.model] = schema.ParamGrads(step, info.model)
            groups.append((record.grad_norm, info.fqn, grads))
        (self._stats or TensorStats(immediate=True)).param_norms(groups)
        return [records[m] for m in sorted(records)]

    def _without_grad(self, step: int, info: ModInfo, module: torch.nn.Module,
                      signals: list[schema.Signal]) -> None:
        """Some of the module's trainable parameters got a gradient: the others, when they
        differ from what was last said of it (an empty list once all of them get one)."""
        without = [name for name, p in module._parameters.items()
                   if p is not None and p.requires_grad and p.grad is None]
        if without == self._partial.get(info, []):
            return
        self._partial[info] = without
        signals.append(schema.Signal(step, info.model, info.fqn, SignalKind.PARAMS_WITHOUT_GRAD, {
            "params": without,
            "with_grad": [name for name, p in module._parameters.items()
                          if p is not None and p.requires_grad and p.grad is not None]}))

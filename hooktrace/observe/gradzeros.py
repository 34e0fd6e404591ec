"""Partly-zero gradients: the share of exactly-zero elements in the gradients reaching the
outputs of each recorded call of a module with children (a ``grad-zeros`` signal per step), of
its outputs that got a non-zero one.

A loss that reads only part of a module's output (a detector's matched anchors, the pixels of a
mask) leaves the rest of that output's gradient exactly zero; a branch multiplied by 0 inside a
forward leaves the gradient reaching the forward's output whole. ``check`` tells the two apart
with this share (``flow.py``). Only modules with children are counted (a forward where a child's
gradient can stop): one more reduction for a few calls. The counts are the statistics'
(``TensorStats.nonzero``): on the CPU read at once, on a device written into the step's buffer of
numbers and read with them, in the one transfer of the step, which this observer asks for when
the pass ends (``TensorStats.resolve``), just before the log writer would.
"""

from __future__ import annotations

import torch

from hooktrace.hooks.records import BackwardStart, Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.stats import TensorStats


class GradZeros(Observer):
    follows = (Mode.RECORDED,)

    def __init__(self, stats: TensorStats, emit: Emit) -> None:
        self._stats = stats
        self._emit = emit
        # this pass's counts: [model, forward seq, elements, non-zero ones (-1 until counted)]
        self._counts: list[list[int]] = []
        self._parents: dict[int, bool] = {}  # per module (by its info's id): has children

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        info = start.call.info
        parent = self._parents.get(id(info))
        if parent is None:
            module = info.ref()
            parent = self._parents[id(info)] = module is not None and bool(module._modules)
        if not parent or type(grad) is not torch.Tensor or grad.layout is not torch.strided \
                or not grad.numel():
            return
        count = [info.model, start.call.seq, grad.numel(), -1]
        self._stats.nonzero(grad, count, 3)  # on a device: filled when the step is resolved
        self._counts.append(count)

    def backward_end(self, end: PassEnd) -> None:
        counts, self._counts = self._counts, []
        if end.mode is not Mode.RECORDED or not counts:
            return
        self._stats.resolve()  # the step's one transfer, with every other number of the step
        # (model, seq) -> [elements, exactly-zero ones] of its outputs that got a gradient: an
        # output whose gradient is all zero is not read at all (multiplied by 0, fully masked)
        totals: dict[tuple[int, int], list[int]] = {}
        for model, seq, n, nonzero in counts:
            if nonzero > 0:
                total = totals.setdefault((model, seq), [0, 0])
                total[0] += n
                total[1] += n - nonzero
        shares: dict[int, dict[str, float]] = {}
        for (model, seq), (n, zeros) in sorted(totals.items()):
            if zeros:
                shares.setdefault(model, {})[str(seq)] = round(zeros / n, 4)
        for model, of_model in sorted(shares.items()):
            self._emit(schema.Signal(end.step, model, "", SignalKind.GRAD_ZEROS,
                                     {"share": of_model}))

    def stop(self, step: int, mode: Mode) -> None:
        self._counts = []

"""Partly-zero gradients: the share of exactly-zero elements in the gradients reaching the
outputs of each recorded call of a module with children (a ``grad-zeros`` signal per step), of
its outputs that got a non-zero one.

A loss that reads only part of a module's output (a detector's matched anchors, the pixels of a
mask) leaves the rest of that output's gradient exactly zero; a branch multiplied by 0 inside a
forward leaves the gradient reaching the forward's output whole. ``check`` tells the two apart
with this share (``flow.py``). Only modules with children are counted (a forward where a child's
gradient can stop): one more reduction for a few calls, read once per step. Only where the
gradients are on the CPU (``stats.on_host``): on a device the read would be a second transfer a
step, and a GPU run gets no such signal yet (``check`` judges those zeros as it did before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hooktrace.hooks.records import BackwardStart, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.observe.stats import on_host

Emit = Callable[[Any], None]


class GradZeros(Observer):
    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        # this pass's counts: (model, forward seq, elements, how many are not zero)
        self._counts: list[tuple[int, int, int, torch.Tensor]] = []
        self._parents: dict[int, bool] = {}  # per module (by its info's id): has children
        self._host = on_host([])  # not when the device path is forced on CPU tensors

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        info = start.call.info
        parent = self._parents.get(id(info))
        if parent is None:
            module = info.ref()
            parent = self._parents[id(info)] = module is not None and bool(module._modules)
        if not parent or type(grad) is not torch.Tensor or grad.layout is not torch.strided \
                or not grad.is_cpu or not self._host or not grad.numel():
            return
        # a tensor: read with the others when the pass ends
        self._counts.append((info.model, start.call.seq, grad.numel(), torch.count_nonzero(grad)))

    def backward_end(self, end: PassEnd) -> None:
        counts, self._counts = self._counts, []
        if end.mode is not Mode.RECORDED or not counts:
            return
        # (model, seq) -> [elements, exactly-zero ones] of its outputs that got a gradient: an
        # output whose gradient is all zero is not read at all (multiplied by 0, fully masked)
        totals: dict[tuple[int, int], list[int]] = {}
        for (model, seq, n, _), nonzero in zip(counts, _read([c[3] for c in counts]),
                                               strict=True):
            if nonzero:
                total = totals.setdefault((model, seq), [0, 0])
                total[0] += n
                total[1] += n - nonzero
        shares: dict[int, dict[str, float]] = {}
        for (model, seq), (n, zeros) in sorted(totals.items()):
            if zeros:
                shares.setdefault(model, {})[str(seq)] = round(zeros / n, 4)
        for model, of_model in sorted(shares.items()):
            self._emit(schema.Signal(end.step, model, "", "grad-zeros", {"share": of_model}))

    def stop(self, step: int, mode: Mode) -> None:
        self._counts = []


def _read(counts: list[torch.Tensor]) -> list[int]:
    """The counts as numbers: one read per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, c in enumerate(counts):
        by_device.setdefault(c.device, []).append(i)
    out = [0] * len(counts)
    for positions in by_device.values():
        values = torch.stack([counts[i] for i in positions]).tolist()
        for i, v in zip(positions, values, strict=True):
            out[i] = int(v)
    return out

"""``--probe``: who may see whom. The first call of each model with parameters in a recorded
step, with gradients on, is probed once (``seeing.py``) on a copy of the model and of its
inputs, with module tracing paused; each fact is a ``probe`` signal.

The copy, its inputs and the probe's generators are its own (``fork_rng``): the program's
weights, random stream, gradients and outputs stay bit-identical. Cost: a deep copy of the
model, one forward and a few vector-Jacobian products on it (2 to 4, 2 more per
masked attention module, 1 more where there is padding), once per model in a run.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from hooktrace.hooks.records import Emit, ForwardEnd, Mode, Observer
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe import seeing


class Probe(Observer):
    """Probes each model once, at its first call in a recorded step with gradients on."""

    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit, pause: Callable[[bool], None]) -> None:
        self._emit = emit
        self._pause = pause  # module tracing off (True) while the probe runs, then on again
        self._done: set[int] = set()
        self._pid = os.getpid()  # a forked child (a DataLoader worker) probes nothing

    def forward_end(self, end: ForwardEnd) -> None:
        info = end.start.info
        if (not end.top or end.mode is not Mode.RECORDED or end.in_backward
                or info.model in self._done or not torch.is_grad_enabled()
                or torch.compiler.is_compiling() or os.getpid() != self._pid
                or torch._C._are_functorch_transforms_active()):
            return
        module = end.start.module
        if next(module.parameters(), None) is None:
            return  # a loss module, a transform: nothing to learn, nothing to probe
        self._done.add(info.model)
        self._pause(True)
        try:
            facts = seeing.probe(module, end.args, end.kwargs)
        except Exception as e:  # never into the program: said in one note
            facts = [{"what": "undecided", "why": f"the probe failed ({type(e).__name__})"}]
        finally:
            self._pause(False)
        for fact in facts:
            inner = fact.pop("module", "")
            name = f"{info.fqn}.{inner}" if info.fqn and inner else inner or info.fqn
            self._emit(schema.Signal(end.start.step, info.model, name, SignalKind.PROBE, fact))

"""Watched steps: after the fully recorded steps, keep looking, write only what is wrong.

A 10,000-step run must not write gigabytes, yet a NaN that first appears at step 9,000 must still
be found with its module. In a watched step the tracer runs its hooks and statistics as usual but
writes no events; at the end of the step this class turns what it saw into ``anomaly`` records:
the first module whose output held NaN/Inf, the first NaN/Inf gradient, and modules with
trainable parameters that received gradient before but got none for their last step's calls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hooktrace import schema

if TYPE_CHECKING:
    from hooktrace.naming import ModInfo


_MAX_HELD = 8192  # calls held per step; forward-only code (no backward, no step end) is bounded


class Watch:
    def __init__(self) -> None:
        self._forward: list[tuple[ModInfo, int, list[list[int]]]] = []
        self._backward: list[schema.BackwardEvent] = []
        # forward calls of modules with parameters: (module, call index, step, got backward?)
        self._calls: list[tuple[ModInfo, int, int, Any]] = []
        self.had_grad: set[ModInfo] = set()  # modules that received gradient at some step

    @property
    def full(self) -> bool:
        """Too much held without a step end: resolve statistics, call ``forward_anomalies``."""
        return len(self._forward) > _MAX_HELD

    def forward(self, info: ModInfo, call: int, nonfinite: list[list[int]]) -> None:
        """``nonfinite`` is filled in by the statistics, maybe only when the step ends."""
        self._forward.append((info, call, nonfinite))

    def forward_anomalies(self, step: int) -> list[schema.Anomaly]:
        bad = [(info, call, found) for info, call, found in self._forward if found]
        self._forward.clear()
        if len(self._calls) > _MAX_HELD:
            del self._calls[: len(self._calls) // 2]
        if not bad:
            return []
        info, call, found = bad[0]
        return [schema.Anomaly(step, info.model, info.name, "nonfinite-forward", call, {
            "outputs": [{"index": i, "nan": nan, "inf": inf} for i, nan, inf in found],
            "modules_with_nonfinite_outputs": len(bad)})]

    def backward(self, event: schema.BackwardEvent) -> None:
        self._backward.append(event)

    def param_call(self, info: ModInfo, call: int, step: int, pending: Any) -> None:
        """``pending.bwd`` is set once the call's backward starts."""
        self._calls.append((info, call, step, pending))

    def end_step(self, step: int) -> list[schema.Anomaly]:
        """Anomalies of ``step``; call after the step's statistics are resolved."""
        out = self.forward_anomalies(step)
        for event in self._backward:
            outs = event.grad_output_stats or []
            ins = event.grad_input_stats or []
            received = any(s is not None and not math.isfinite(s[0]) for s in outs)
            if received or any(s is not None and not math.isfinite(s[0]) for s in ins):
                out.append(schema.Anomaly(step, event.model, event.name, "nonfinite-backward",
                                          event.call, {"produced": not received}))
                break
        out += self._lost_gradients(step)
        self._backward.clear()
        return out

    def _lost_gradients(self, step: int) -> list[schema.Anomaly]:
        # a call may get its backward one step later (a GAN's generator): judge last step's calls
        judged = [c for c in self._calls if c[2] < step]
        self._calls = [c for c in self._calls if c[2] >= step]
        got = {info for info, _, _, pending in judged if pending.bwd is not None}
        out: list[schema.Anomaly] = []
        for info, call, call_step, _ in judged:
            if info in self.had_grad and info not in got:
                self.had_grad.discard(info)  # reported once, until it receives gradient again
                out.append(schema.Anomaly(call_step, info.model, info.name, "no-grad", call,
                                          {"had_gradient_before": True}))
        return out

"""Where NaN/Inf first appear in a log, as ``collect`` finds them: in a forward output, in a
gradient (received or produced by a module's backward), in a parameter gradient's norm, or in a
watched step's anomaly record. One rule for all four; standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hooktrace.check.collected import Collected, Nonfinite
from hooktrace.log import schema
from hooktrace.log.decoder import Stats
from hooktrace.log.schema import AnomalyKind


def _finite(stat: list[float] | None) -> bool:
    return stat is None or math.isfinite(stat[0])


def _counts(stats: Iterable[list[float] | None]) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(stats):
        if s is not None and not math.isfinite(s[0]):
            out.append({"index": i, "nan": int(s[2]) if len(s) > 2 else None,
                        "inf": int(s[3]) if len(s) > 3 else None})
    return out


def forward_outputs(c: Collected, step: int, module: tuple[int, str], call: int,
                    shapes: list[Any], dtypes: list[str], nonfinite: list[list[int]],
                    before: tuple[int, str] | None = None) -> None:
    """A forward call whose outputs held NaN/Inf: ``[output index, nan, inf]`` each; the
    outputs' dtypes where the log has them (an overflow depends on it); ``before``, the call
    that returned just before it in the step (None: the step's first)."""
    c.forward_nonfinite_steps.add(step)
    c.forward_first.setdefault(step, module)
    if c.first_forward_nonfinite is None:
        c.forward_first_before = before
        c.first_forward_nonfinite = Nonfinite(step, *module, {
            "call": call, "outputs": [
                {"index": i, "shape": shapes[i] if i < len(shapes) else None,
                 **({"dtype": dtypes[i]} if i < len(dtypes) else {}),
                 "nan": nan, "inf": inf} for i, nan, inf in nonfinite],
        })


def gradients(c: Collected, step: int, module: tuple[int, str], call: int,
              in_stats: Stats | None, out_stats: Stats | None) -> None:
    """A backward event's statistics: NaN/Inf received (in grad_output) or produced."""
    outs, ins = out_stats or [], in_stats or []
    received = not all(_finite(s) for s in outs)
    produced = not received and not all(_finite(s) for s in ins)
    if received or produced:
        c.backward_nonfinite_steps.add(step)
        c.backward_first.setdefault(step, (module, produced))
        if c.first_backward_nonfinite is None:
            c.first_backward_nonfinite = Nonfinite(step, *module, {
                "call": call, "produced": produced, "grad_output": _counts(outs),
                "grad_input": _counts(ins)})


def parameter_norms(c: Collected, r: schema.ParamGrads) -> None:
    """A params record: a norm that is not finite is a NaN/Inf produced."""
    # the sum is finite when every norm is: the exact test only runs when it is not
    if not math.isfinite(sum(filter(None, r.grad_norm.values()))) and any(
            v is not None and not math.isfinite(v) for v in r.grad_norm.values()):
        c.backward_nonfinite_steps.add(r.step)
        if c.first_backward_nonfinite is None:
            name = next(k for k, v in r.grad_norm.items()
                        if v is not None and not math.isfinite(v))
            c.first_backward_nonfinite = Nonfinite(r.step, r.model, name, {
                "produced": True, "parameter_grad_norm": str(r.grad_norm[name])})


def anomaly(c: Collected, r: schema.Anomaly) -> None:
    """A watched step's record: the same findings as from events, without the events."""
    found = Nonfinite(r.step, r.model, r.fqn, {"call": r.call, **r.detail})
    if r.kind == AnomalyKind.NONFINITE_FORWARD:
        c.forward_nonfinite_steps.add(r.step)
        first = c.first_forward_nonfinite
        if first is None or r.step < first.step:
            c.first_forward_nonfinite = found
    elif r.kind == AnomalyKind.NONFINITE_BACKWARD:
        c.backward_nonfinite_steps.add(r.step)
        first = c.first_backward_nonfinite
        if first is None or r.step < first.step:
            c.first_backward_nonfinite = found

"""Loss scaling used wrong, from the signals of ``lossgraph``: a loss multiplied by the
``GradScaler``'s scale twice (``loss-scaled``), an optimizer that stepped gradients still scaled
(``scaled-step``: ``optimizer.step()`` instead of ``scaler.step(optimizer)``), and gradients
clipped before they were unscaled (``scaled-clip``). The NaN/Inf and the growing gradients that
follow from the first two are said as their consequence. Pure: a ``Collected`` in."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hooktrace.check.findings import ERROR, WARNING, Finding, FindingKind, names_text
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

# findings that gradients too large by the scale explain, in the same model from its step on
_CONSEQUENCES = (FindingKind.NONFINITE_FORWARD, FindingKind.NONFINITE_BACKWARD, "exploding")


def check_scaling(c: Collected) -> list[Finding]:
    out: list[Finding] = []
    twice: set[int] = set()
    for s in c.signals:
        if s.kind == SignalKind.LOSS_SCALED and int(s.detail.get("times") or 0) > 1 \
                and s.model not in twice:
            twice.add(s.model)
            out.append(_twice(c, s))
    return out


def _scale(c: Collected, s: Signal) -> str:
    """The scale in force at the signal's step, as the ``loss-scale`` signals say."""
    scales = [x for x in c.signals if x.kind == SignalKind.LOSS_SCALE and x.model == s.model
              and x.step <= s.step]
    return f"{float(scales[-1].detail.get('scale') or 0):g}" if scales else "the scale"


def _twice(c: Collected, s: Signal) -> Finding:
    times, scale = int(s.detail["times"]), _scale(c, s)
    return Finding(
        "scaled-twice", ERROR, c.model_name(s.model), "", s.step,
        f"the loss of model '{c.model_name(s.model)}' was multiplied by the GradScaler's scale "
        f"({scale}) {'twice' if times == 2 else f'{times} times'} before backward: "
        "scaler.step() divides the gradients by it once, so the optimizer applies gradients "
        + (f"{scale}x" if times == 2 else f"{scale}^{times - 1} times") + " too large",
        {"times": times}, "call scaler.scale(loss) once, right before .backward(): a helper "
        "that returns scaler.scale(loss) gives a loss that must not be scaled again")


def scaled_step(c: Collected, s: Signal) -> list[Finding]:
    scale = _scale(c, s)
    modules = [str(m) for m in s.detail.get("modules", [])]
    return [Finding(
        FindingKind.SCALED_STEP, ERROR, c.model_name(s.model), "", s.step,
        f"{s.detail.get('optimizer', 'an optimizer')}.step() applied the gradients of model "
        f"'{c.model_name(s.model)}' ({names_text(modules)}) still multiplied by the loss scale "
        f"({scale}): scaler.scale(loss).backward() was followed by optimizer.step(), not "
        f"scaler.step(optimizer), so each update is {scale}x too large and steps with inf/NaN "
        "gradients are not skipped",
        {"optimizer": s.detail.get("optimizer"), "modules": modules[:50]},
        "step through the scaler: scaler.step(optimizer); scaler.update() (to clip, call "
        "scaler.unscale_(optimizer) first)")]


def scaled_clip(c: Collected, s: Signal) -> list[Finding]:
    scale = _scale(c, s)
    modules = [str(m) for m in s.detail.get("modules", [])]
    max_norm = s.detail.get("max_norm")
    return [Finding(
        "clip-before-unscale", WARNING, c.model_name(s.model), "", s.step,
        f"clip_grad_norm_(max_norm={max_norm}) clipped the gradients of model "
        f"'{c.model_name(s.model)}' ({names_text(modules)}) while they were still multiplied "
        f"by the loss scale ({scale}): scaler.step() divides them by it afterwards, so the "
        f"update is at most max_norm/{scale} and the weights hardly move",
        {"max_norm": max_norm, "modules": modules[:50]},
        "unscale first: scaler.unscale_(optimizer); clip_grad_norm_(...); "
        "scaler.step(optimizer); scaler.update()")]


def after_scaling(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the NaN/Inf and growing-gradient findings of a model whose optimizer
    applied gradients too large by the scale, from that step on, marked as following from it."""
    causes = {(f.model, f.cause): f.step or 0 for f in findings
              if f.cause in (FindingKind.SCALED_STEP, "scaled-twice")}
    out = []
    for f in findings:
        cause = next((kind for (model, kind), step in causes.items()
                      if model == f.model and (f.step or 0) >= step), None)
        if f.cause in _CONSEQUENCES and cause is not None and "follows" not in f.evidence:
            f = replace(f, evidence={**f.evidence, "follows": cause},
                        hint=(f"gradients too large by the loss scale were applied (the {cause} "
                              "finding): fix that first"))
        out.append(f)
    return out

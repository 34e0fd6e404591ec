"""The user's own gradient code: hooks that pile up step after step (``hooks-growing``) and a
custom ``autograd.Function`` whose backward disagrees with its forward (``function-backward``).
Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, names_text
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

_HOOKS = {
    "forward": ("forward hooks", "register_forward_hook", "each runs at every call, so what "
                "they compute or collect is counted once more every step"),
    "backward": ("module backward hooks", "register_full_backward_hook", "each runs in every "
                 "backward pass, so the gradient is changed once more every step"),
    "gradient": ("gradient hooks on their parameters", "register_hook", "each runs in every "
                 "backward pass, so the gradient is changed once more every step"),
}


def check_custom(c: Collected) -> list[Finding]:
    out: list[Finding] = []
    growing: dict[tuple[int, str, int], list[Signal]] = {}
    for s in c.signals:
        if s.kind == SignalKind.HOOKS_GROWING:
            growing.setdefault((s.model, s.detail.get("hooks", "?"), s.step), []).append(s)
    for (model, kind, step), signals in sorted(growing.items()):
        out.append(_growing(c, model, kind, step, signals))
    return out


def _growing(c: Collected, model: int, kind: str, step: int, signals: list[Signal]) -> Finding:
    what, call, effect = _HOOKS.get(kind, (f"{kind} hooks", "register_hook", ""))
    names = [s.fqn for s in signals]
    first = signals[0].detail
    counts = ", ".join(map(str, first.get("counts", [])))
    steps = ", ".join(map(str, first.get("steps", [])))
    whose = c.label(model, names[0]) if len(names) == 1 else names_text(names)
    return Finding(
        FindingKind.HOOKS_GROWING, WARNING, c.model_name(model), names[0], step,
        f"{whose}: the {what} grew at every recorded step ({counts} at steps {steps}): a hook "
        f"is registered in the training loop and never removed; {effect}",
        {"modules": names, "hooks": kind, "counts": first.get("counts", []),
         "steps": first.get("steps", [])},
        f"call {call} once, before the loop, or keep the handle it returns and call "
        "handle.remove() when the step is done")


_SAYS = {
    "ignores-grad": "returns the same gradient whatever grad_output it gets (twice the "
                    "grad_output, the same result): it does not multiply by grad_output, so "
                    "the layers before it get a gradient that does not depend on the loss",
    "nonlinear": "is not linear in grad_output (twice the grad_output does not give twice the "
                 "gradient), as a backward that clips or normalises the gradient is",
    "scaled": "gives {ratio:.3g} times the finite-difference gradient of its forward: a "
              "factor of the forward (a constant, a scale) is missing from it or added",
    "reversed": "gives {ratio:.3g} times the finite-difference gradient of its forward: the "
                "gradient comes back with its sign flipped",
    "mismatch": "disagrees with the finite-difference gradient of its forward at {off} of "
                "{elements} elements compared (worst: {backward:.3g} where the forward's slope "
                "is {numeric:.3g})",
    "modifier": "changes the gradient on purpose (its forward returns its input unchanged): "
                "{change}",
    "surrogate": "is a surrogate gradient: its forward is flat where the two differ (a "
                 "straight-through estimator)",
}
_NOTES = {"nonlinear", "modifier", "surrogate"}


def verdict(d: Mapping[str, Any]) -> str:
    """What a ``function-backward`` signal's measurements say of the backward: one that does
    not double with ``grad_output`` ignores it (the same result) or is not linear in it; a
    forward that returns its input unchanged exists to alter the gradient (a reversal, a
    multiplier: a ``modifier``); one flat where they disagree is a surrogate (a
    straight-through estimator's ``round``); else the backward is wrong, ``scaled`` or
    ``reversed`` when it is the true gradient times one factor, ``mismatch`` else."""
    twice = d.get("twice", "double")
    if twice != "double":
        return "ignores-grad" if twice == "same" else "nonlinear"
    if d.get("identity"):
        return "modifier"
    if d.get("flat"):
        return "surrogate"
    ratio = d.get("ratio")
    if isinstance(ratio, (int, float)):
        return "reversed" if ratio < 0 else "scaled"
    return "mismatch"


def function_backward(c: Collected, s: Signal) -> list[Finding]:
    d: dict[str, Any] = dict(s.detail)
    d["verdict"] = judged = verdict(s.detail)
    ratio = d.get("ratio")
    d.setdefault("ratio", 0.0)
    d.setdefault("off", 0)
    d.setdefault("elements", 0)
    d.setdefault("backward", 0.0)
    d.setdefault("numeric", 0.0)
    d["change"] = (f"it multiplies it by {ratio:.3g}" if ratio is not None
                   else "not by one factor")
    fn = d.get("function", "?")
    site = f"{d.get('file', '?')}:{d.get('line', '?')}"
    says = _SAYS[judged].format(**d)
    where = f"in {c.label(s.model, s.fqn)}" if s.fqn else f"in model '{c.model_name(s.model)}'"
    severity = NOTE if judged in _NOTES else WARNING
    hint = ("nothing to do if that is the intent" if severity is NOTE else
            "backward must return grad_output times the derivative of forward (the chain "
            "rule: a constant forward multiplies by, backward multiplies by too); check it "
            "with torch.autograd.gradcheck on double inputs")
    return [Finding(
        FindingKind.FUNCTION_BACKWARD, severity, c.model_name(s.model), s.fqn, s.step,
        f"the autograd.Function {fn} ({site}), used {where}: its backward {says}",
        {k: d[k] for k in ("function", "file", "line", "verdict", "ratio", "elements", "off")
         if k in s.detail or k == "verdict"}, hint)]

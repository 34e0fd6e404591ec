"""Gradient-flow causes the user's loop and code make: a model an optimizer steps that no
backward pass reached, or that ran only under ``torch.no_grad()``; parameters a forward uses
outside autograd; the deprecated backward hook that sees only the last op; hooks that pile up
step after step (``hooks-growing``); a custom ``autograd.Function`` whose backward disagrees
with its forward (``function-backward``). Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hooktrace.check import holds
from hooktrace.check.findings import (
    ERROR,
    NOTE,
    WARNING,
    Finding,
    FindingKind,
    names_text,
    steps_text,
)
from hooktrace.check.trainable import frozen_during_run
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn
    from hooktrace.log.schema import Signal


def check_loop(c: Collected) -> list[Finding]:
    """What the loop did around the modules, beyond what one signal says (``signals``)."""
    return (_never_reached(c) + _outside_autograd(c) + frozen_during_run(c)
            + holds.check_on_wrapper(c))


def _outside_autograd(c: Collected) -> list[Finding]:
    """Modules an optimizer steps whose backward ran in every recorded step while their own
    parameters never got a gradient (others of their model did): forward uses the parameters
    through ``.item()``, ``float()``, ``.data`` or ``.detach()``."""
    held = holds.held(c)
    got: set[ModelFqn] = set()
    none: dict[ModelFqn, list[int]] = {}
    for step in sorted(c.param_norms):
        reached = c.backward.get(step, frozenset())
        for model, names, norms in c.param_norms[step]:
            if not any(v is not None for v in norms):
                continue  # no parameter gradient at all (autograd.grad): nothing to compare
            for name, norm in zip(names, norms, strict=True):
                key = (model, name)
                if norm is not None:
                    got.add(key)
                elif key in reached and key in held:
                    none.setdefault(key, []).append(step)
    out = []
    for key, steps in none.items():
        if key not in got:
            model, name = key
            out.append(Finding(
                FindingKind.NO_GRAD, WARNING, c.model_name(model), name, steps[0],
                f"{c.label(model, name)}: its backward ran but its own parameters never got a "
                f"gradient ({steps_text(steps)}): its forward uses them outside autograd",
                {"steps": steps[:20]},
                ".item(), float(), .data, .detach(), .numpy() or torch.tensor(p) on a parameter "
                "cut it from the graph: compute with the parameter tensor itself"))
    return out + _params_outside_autograd(c, held)


def _params_outside_autograd(c: Collected, held: set[ModelFqn]) -> list[Finding]:
    """The same, per parameter: a module an optimizer steps whose own parameters got a
    gradient in part, in every recorded step that said so (``params-without-grad``)."""
    first: dict[ModelFqn, int] = {}
    without: dict[ModelFqn, list[str]] = {}  # said in every signal of the module
    with_grad: dict[ModelFqn, list[str]] = {}  # as last said
    for s in c.signals:
        key = (s.model, s.fqn)
        if s.kind != SignalKind.PARAMS_WITHOUT_GRAD or key not in held:
            continue
        said = s.detail.get("params", [])
        first.setdefault(key, s.step)
        without[key] = [p for p in without.get(key, said) if p in said]
        with_grad[key] = s.detail.get("with_grad", [])
    out = []
    for (model, name), params in without.items():
        got, step = with_grad[(model, name)], first[(model, name)]
        if params and got:
            out.append(Finding(
                FindingKind.NO_GRAD, WARNING, c.model_name(model), name, step,
                f"{c.label(model, name)}: its {names_text(params)} never got a gradient "
                f"though its {names_text(got)} did (from step {step} on): its forward "
                f"uses {'it' if len(params) == 1 else 'them'} outside autograd (.data, "
                ".detach(), a copy), or not at all",
                {"params": params, "with_grad": got},
                f"compute with the parameter itself (self.{params[0]}, not "
                f"self.{params[0]}.data or a copy); for weight normalisation, "
                "torch.nn.utils.parametrizations.weight_norm"))
    return out


def backward_hook_only(c: Collected, s: Signal) -> list[Finding]:
    hook = s.detail.get("hook", "?")
    return [Finding(
        FindingKind.BACKWARD_HOOK, WARNING, c.model_name(s.model), s.fqn, None,
        f"{c.label(s.model, s.fqn)} has a hook from the deprecated "
        f"register_backward_hook ({hook}): its forward is more than one operation, and the "
        "hook sees the gradients of the last one only, not the module's",
        {"hook": hook},
        "use module.register_full_backward_hook(...) instead")]


def _never_reached(c: Collected) -> list[Finding]:
    """A model whose parameters an optimizer steps, run with gradients on, that no backward
    pass ever reached: the loss was computed from a detached output."""
    out = []
    held = {model for model, _ in holds.held(c)}
    # (held by an optimizer at some point: a GAN's generator is, once its optimizer steps)
    backed = c.backward_models()
    ran = {key[0] for keys in c.grad.values() for key in keys}
    ran_no_grad = {key[0] for keys in c.no_grad.values() for key in keys}
    for model in sorted(held & ran_no_grad - ran - backed):
        out.append(Finding(
            FindingKind.NO_GRAD_UNDER_NO_GRAD, WARNING, c.model_name(model), "", None,
            f"model '{c.model_name(model)}' ran only under torch.no_grad() while an optimizer "
            "steps its parameters: they never get a gradient",
            {}, "call it outside torch.no_grad() to train it; to keep it frozen on purpose, "
            "call .requires_grad_(False) on it and leave its parameters out of the optimizer"))
    for model in sorted(held & ran - backed):
        out.append(Finding(
            "never-reached", ERROR, c.model_name(model), "", None,
            f"model '{c.model_name(model)}' ran forward with gradients on and an optimizer "
            "steps its parameters, but no backward pass ever reached it: its parameters never "
            "get a gradient",
            {}, "the loss is computed from a detached output (.detach(), .item(), numpy, a "
            "new tensor such as torch.tensor(loss.item(), requires_grad=True)) or from argmax, "
            "round or comparisons, which have no gradient (loss.requires_grad = True only hides "
            "the error): compute it from the model's output tensor"))
    return out


_ON_GRADIENT = "each runs in every backward pass, so the gradient is changed once more every step"
_HOOKS = {
    "forward": ("forward hooks", "register_forward_hook", "each runs at every call, so what "
                "they compute or collect is counted once more every step"),
    "backward": ("module backward hooks", "register_full_backward_hook", _ON_GRADIENT),
    "gradient": ("gradient hooks on their parameters", "register_hook", _ON_GRADIENT),
}


def check_custom(c: Collected) -> list[Finding]:
    """Hooks that grew at every recorded step (``hooks-growing``), one finding a kind a step."""
    growing: dict[tuple[int, str, int], list[Signal]] = {}
    for s in c.signals:
        if s.kind == SignalKind.HOOKS_GROWING:
            growing.setdefault((s.model, s.detail.get("hooks", "?"), s.step), []).append(s)
    return [_growing(c, *key, signals) for key, signals in sorted(growing.items())]


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

"""Training-loop findings: what the ``signal`` records say the loop did around the modules.

Each is a frequent forum question that module hooks can answer: backward in eval mode,
parameters no optimizer holds, gradients never cleared, the deprecated backward hook that sees
only the last op, frozen BatchNorms still updating, a model no backward reaches, a parameter
its module reads outside autograd, gradients zeroed before the step, a parameter created in
forward, modules frozen during the run (an evaluation helper's ``requires_grad_(False)``) or
unfrozen with no optimizer holding them; updates that do not happen or do harm (``updates``);
and what the optimizer holds versus what the model is (``holds``). Pure: a ``Collected``
in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import (
    ERROR,
    WARNING,
    Finding,
    FindingKind,
    names_text,
    steps_text,
)
from hooktrace.check.holds import (
    check_on_wrapper,
    outside_text,
    parametrized_hint,
    twice_text,
)
from hooktrace.check.trainable import frozen_during_run, unfrozen_at
from hooktrace.check.updates import (
    norms_at,
)
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn
    from hooktrace.log.schema import Signal


def check_loop(c: Collected) -> list[Finding]:
    """What the loop did around the modules, beyond what one signal says (``signals``)."""
    return (_never_reached(c) + _outside_autograd(c) + frozen_during_run(c)
            + check_on_wrapper(c))


def not_held(c: Collected, s: Signal) -> list[Finding]:
    """The modules with trainable parameters that got a gradient and no optimizer holds."""
    got = _got_gradient(c, s.model)
    missing = [name for name in s.detail.get("not_held", []) if name in got]
    if not missing:
        return []
    unfrozen = {name: step for name, step in unfrozen_at(c).items() if name[0] == s.model}
    if not s.detail.get("held"):
        return [Finding(
            FindingKind.NOT_OPTIMIZED, WARNING, c.model_name(s.model), "", None,
            f"no optimizer that steps holds any parameter of model '{c.model_name(s.model)}': "
            f"its {plural(len(missing), 'module')} with trainable parameters "
            f"({names_text(missing)}) get gradients and never train{twice_text(c)}",
            {"modules": missing},
            ("the loop steps another model's optimizer where this model's should step "
             "(opt_g.step() after d_loss.backward()), or " if _others_held(c, s.model) else "")
            + "the optimizer was built from another copy of the model (the model created again "
            "after the optimizer, a deepcopy, a reloaded checkpoint): build it from the "
            "parameters() of the model you train")]
    thawed = [unfrozen[(s.model, name)] for name in missing if (s.model, name) in unfrozen]
    if thawed:
        return [Finding(
            FindingKind.NOT_OPTIMIZED, WARNING, c.model_name(s.model), missing[0], min(thawed),
            f"{names_text(missing)} ({plural(len(missing), 'module')} of model "
            f"'{c.model_name(s.model)}') were unfrozen (requires_grad=True) at step "
            f"{min(thawed)}, but no optimizer that steps holds their parameters: they get "
            "gradients and never train",
            {"modules": missing, "unfrozen_at": min(thawed)},
            "the optimizer was built while they were frozen (from the parameters that "
            "required a gradient then): add them when unfreezing "
            "(optimizer.add_param_group({'params': module.parameters()})), or build it from "
            "all of model.parameters(): frozen ones get no gradient and are not updated")]
    return [Finding(
        FindingKind.NOT_OPTIMIZED, WARNING, c.model_name(s.model), missing[0], None,
        f"no optimizer that steps holds the parameters of {names_text(missing)} "
        f"({plural(len(missing), 'module')} of model '{c.model_name(s.model)}'): they get "
        "gradients and never train" + outside_text(s.detail),
        {"modules": missing},
        # "block.(Linear)": called inside a forward, not in the model's tree
        "they are not registered submodules (kept in a plain list or dict, or built inside "
        "forward), so model.parameters() misses them: use nn.ModuleList / nn.ModuleDict, or "
        "assign them in __init__" if any("(" in name for name in missing) else
        parametrized_hint(missing, bool(s.detail.get("outside_count"))) or _only_held_hint(s) or
        "build the optimizer after adding layers (or add_param_group), from this model's "
        "parameters(), not from another copy's")]


def _others_held(c: Collected, model: int) -> bool:
    """Whether an optimizer that steps holds parameters of another model (several models
    trained side by side, each with its own optimizer)."""
    return any(t.kind == SignalKind.OPTIMIZERS and t.model != model and t.detail.get("held")
               for t in c.signals)


def _only_held_hint(s: Signal) -> str:
    """The optimizer holds one subtree of the model (its head) and not the modules beside it."""
    held = s.detail.get("held") or []
    tops = sorted({name.split(".")[0] for name in held if name})
    if len(tops) != 1 or any(n.split(".")[0] == tops[0] for n in s.detail.get("not_held", [])):
        return ""
    return (f"the optimizer holds only {tops[0]}'s parameters: pass model.parameters() (or "
            "freeze the others with requires_grad_(False) if intended)")


def _outside_autograd(c: Collected) -> list[Finding]:
    """Modules an optimizer steps whose backward ran in every recorded step while their own
    parameters never got a gradient (others of their model did): forward uses the parameters
    through ``.item()``, ``float()``, ``.data`` or ``.detach()``."""
    held = {(s.model, name) for s in c.signals if s.kind == SignalKind.OPTIMIZERS
            for name in s.detail.get("held", [])}
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


def _got_gradient(c: Collected, model: int) -> set[str]:
    got = {name for keys in c.backward.values() for (m, name) in keys if m == model}
    for records in c.param_norms.values():
        for m, names, norms in records:
            if m == model:
                got.update(n for n, v in zip(names, norms, strict=True) if v is not None)
    return got


def carried_over(c: Collected, s: Signal) -> list[Finding]:
    modules = sorted(s.detail.get("modules", []), key=lambda name: _order(c, s.model, name))
    return [Finding(
        FindingKind.GRADS_CARRIED_OVER, WARNING, c.model_name(s.model),
        modules[0] if modules else "", s.step,
        f"the gradients of {plural(len(modules), 'module')} of model "
        f"'{c.model_name(s.model)}' ({names_text(modules)}) were not cleared after "
        f"optimizer.step(): the backward of step {s.step} adds to the previous step's",
        {"modules": modules},
        "call optimizer.zero_grad() once per optimizer step (gradient accumulation: after "
        "each optimizer.step(), not after each micro-batch)")]


def grads_cleared(c: Collected, s: Signal) -> list[Finding]:
    modules = sorted(s.detail.get("modules", []), key=lambda name: _order(c, s.model, name))
    return [Finding(
        FindingKind.GRADS_CLEARED, WARNING, c.model_name(s.model), modules[0] if modules else "",
        s.step,
        f"optimizer.step() after step {s.step} found every gradient of model "
        f"'{c.model_name(s.model)}' already cleared ({plural(len(modules), 'module')} the "
        f"backward reached: {names_text(modules)}): zero_grad() ran between backward() and "
        "step(), so the weights do not change",
        {"modules": modules},
        "order the loop as optimizer.zero_grad(); loss.backward(); optimizer.step()")]


def grads_zeroed(c: Collected, s: Signal) -> list[Finding]:
    """An optimizer stepped with every gradient exactly zero: a problem when the backward of
    that step gave them non-zero norms (without a ``params`` record of it, taken as given)."""
    modules = sorted(s.detail.get("modules", []), key=lambda name: _order(c, s.model, name))
    at_step = norms_at(c, s.model, s.step)
    norms = [at_step[name] for name in modules if name in at_step]
    if norms and not any(norms):
        return []  # the backward gave zero gradients itself (a loss of 0): nothing was zeroed
    return [Finding(
        FindingKind.GRADS_ZEROED, WARNING, c.model_name(s.model), modules[0] if modules else "",
        s.step,
        f"optimizer.step() after step {s.step} found every gradient of model "
        f"'{c.model_name(s.model)}' exactly zero, though its backward gave "
        f"{plural(len(modules), 'module')} ({names_text(modules)}) non-zero ones: they were "
        "zeroed between backward() and step(), so the weights do not change",
        {"modules": modules},
        "clip_grad_norm_ with max_norm=0 (it does not mean off: leave the call out), or "
        "zero_grad() between backward() and step(): order the loop as "
        "optimizer.zero_grad(); loss.backward(); optimizer.step()")]


def params_recreated(c: Collected, s: Signal) -> list[Finding]:
    params = s.detail.get("params", [])
    quoted = ", ".join(f"'{p}'" for p in params)
    return [Finding(
        FindingKind.PARAMS_RECREATED, WARNING, c.model_name(s.model), s.fqn, s.step,
        f"{c.label(s.model, s.fqn)} creates a new nn.Parameter {quoted} in its forward at every "
        "call: no optimizer holds it, and it restarts from its initial value each step",
        {"params": params},
        "create it once, in __init__, and use it in forward")]


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
    held = {s.model for s in c.signals if s.kind == SignalKind.OPTIMIZERS and s.detail.get("held")}
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


def _order(c: Collected, model: int, name: str) -> int:
    m = c.modules.get((model, name))
    return m.first_seq or 0 if m is not None else 0

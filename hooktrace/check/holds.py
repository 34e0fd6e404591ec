"""What the optimizers hold against what the model is, and the gradients they step: modules
with trainable parameters no optimizer that steps holds (and why: another model's optimizer, a
copy of the model, a parametrization registered after it was built, an unfreeze it missed), a
module set on a wrapper (``DataParallel``, DDP, ``torch.compile``'s) never run, two Parameters
over one storage in one optimizer, a Parameter created in forward, gradients carried over,
cleared or zeroed around the step. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text
from hooktrace.check.stepexplained import stepped_again
from hooktrace.check.trainable import unfrozen_at
from hooktrace.check.updates import norms_at
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn
    from hooktrace.log.schema import Signal

def not_held(c: Collected, s: Signal) -> list[Finding]:
    """The modules with trainable parameters that got a gradient and no optimizer holds, and
    why: no optimizer of the model at all, unfrozen after it was built, or left out of it."""
    got = _got_gradient(c, s.model)
    missing = [name for name in s.detail.get("not_held", []) if name in got]
    if not missing:
        return []
    model, these = c.model_name(s.model), f"{plural(len(missing), 'module')} of model"
    unfrozen = {name: step for name, step in unfrozen_at(c).items() if name[0] == s.model}
    thawed = [unfrozen[(s.model, name)] for name in missing if (s.model, name) in unfrozen]
    evidence: dict[str, Any] = {"modules": missing}
    if not s.detail.get("held"):
        module, step = "", None
        message = (f"no optimizer that steps holds any parameter of model '{model}': its "
                   f"{plural(len(missing), 'module')} with trainable parameters "
                   f"({names_text(missing)}) get gradients and never train{twice_text(c)}")
        others = {m for m, _ in held(c)} - {s.model}  # models trained side by side
        hint = (("the loop steps another model's optimizer where this model's should step "
                 "(opt_g.step() after d_loss.backward()), or " if others
                 else "") + "the optimizer was built from another copy of the model (the "
                "model created again after the optimizer, a deepcopy, a reloaded checkpoint): "
                "build it from the parameters() of the model you train")
    elif thawed:
        module, step = missing[0], min(thawed)
        evidence["unfrozen_at"] = step
        message = (f"{names_text(missing)} ({these} '{model}') were unfrozen "
                   f"(requires_grad=True) at step {step}, but no optimizer that steps holds "
                   "their parameters: they get gradients and never train")
        hint = ("the optimizer was built while they were frozen (from the parameters that "
                "required a gradient then): add them when unfreezing "
                "(optimizer.add_param_group({'params': module.parameters()})), or build it "
                "from all of model.parameters(): frozen ones get no gradient and are not "
                "updated")
    else:
        module, step = missing[0], None
        message = (f"no optimizer that steps holds the parameters of {names_text(missing)} "
                   f"({these} '{model}'): they get gradients and never train"
                   + outside_text(s.detail))
        # "block.(Linear)": called inside a forward, not in the model's tree
        hint = ("they are not registered submodules (kept in a plain list or dict, or built "
                "inside forward), so model.parameters() misses them: use nn.ModuleList / "
                "nn.ModuleDict, or assign them in __init__" if any("(" in n for n in missing)
                else parametrized_hint(missing, bool(s.detail.get("outside_count")))
                or _only_held_hint(s) or "build the optimizer after adding layers (or "
                "add_param_group), from this model's parameters(), not from another copy's")
    return [Finding(FindingKind.NOT_OPTIMIZED, WARNING, model, module, step, message, evidence,
                    hint)]


def held(c: Collected) -> set[ModelFqn]:
    """The modules an optimizer that stepped held at some point (``optimizers`` signals)."""
    return {(s.model, name) for s in c.signals if s.kind == SignalKind.OPTIMIZERS
            for name in s.detail.get("held", [])}


def _only_held_hint(s: Signal) -> str:
    """The optimizer holds one subtree of the model (its head) and not the modules beside it."""
    held = s.detail.get("held") or []
    tops = sorted({name.split(".")[0] for name in held if name})
    if len(tops) != 1 or any(n.split(".")[0] == tops[0] for n in s.detail.get("not_held", [])):
        return ""
    return (f"the optimizer holds only {tops[0]}'s parameters: pass model.parameters() (or "
            "freeze the others with requires_grad_(False) if intended)")


def _got_gradient(c: Collected, model: int) -> set[str]:
    got = {name for keys in c.backward.values() for (m, name) in keys if m == model}
    for records in c.param_norms.values():
        for m, names, norms in records:
            if m == model:
                got.update(n for n, v in zip(names, norms, strict=True) if v is not None)
    return got


# the attribute of each wrapper that holds the model (naming.WRAPPERS; this side reads logs)
_WRAPPED = {"DistributedDataParallel": "module", "DataParallel": "module",
            "OptimizedModule": "_orig_mod"}


def on_wrapper(c: Collected) -> set[ModelFqn]:
    """The modules a wrapper holds beside the model it wraps, and the modules inside them."""
    tops = [(m.model, m.fqn) for m in c.modules.values() if m.wrapper]
    return {key for key in c.modules for model, name in tops
            if key[0] == model and (key[1] == name or key[1].startswith(name + "."))}


def check_on_wrapper(c: Collected) -> list[Finding]:
    """A module with trainable parameters set on the wrapper around a model that trained, never
    called: the wrapper's forward runs the wrapped model only (``model.fc = nn.Linear(...)`` on
    a ``DataParallel``; the model's own ``fc`` runs instead)."""
    if TraceOptions.from_header(c.header).filtered:
        return []  # a filtered-out module is never called in the log
    trained = c.backward_models()
    below = on_wrapper(c)
    out = []
    for m in sorted(c.modules.values(), key=lambda m: (m.model, m.fqn)):
        if not m.wrapper or m.model not in trained:
            continue
        inside = [c.modules[key] for key in below if key[0] == m.model
                  and (key[1] == m.fqn or key[1].startswith(m.fqn + "."))]
        if any(o.calls for o in inside):
            continue  # the script calls it itself
        trainable = sum(o.trainable for o in inside)
        if not trainable:
            continue
        attr = m.fqn.rpartition(").")[2]
        twin = c.modules.get((m.model, m.fqn.rpartition(f"({m.wrapper}).")[0] + attr))
        wrapped = _WRAPPED.get(m.wrapper)
        model = c.model_name(m.model)
        out.append(Finding(
            "set-on-wrapper", WARNING, model, m.fqn, None,
            f"{attr} ({m.cls}) was set on the {m.wrapper} wrapper around model '{model}', not on "
            f"the model it wraps: the wrapper's forward runs the model only, so it never runs "
            f"and its {plural(trainable, 'trainable parameter')} never train"
            + (f", while the model's own {attr} ({twin.cls}) runs in its place"
               if twin is not None and twin.calls else ""),
            {"wrapper": m.wrapper, "trainable": trainable,
             "runs_instead": twin.fqn if twin is not None and twin.calls else None},
            (f"set it on the wrapped model (model.{wrapped}.{attr} = ...)" if wrapped else
             "set it on the wrapped model") + ", or replace it before wrapping the model"))
    return out


def shared_storage(c: Collected, s: Signal) -> list[Finding]:
    """Two or more Parameters over one storage in one optimizer (a ``shared-storage`` signal):
    each has its own gradient and its own step, and both steps land on the one tensor."""
    params = [str(p) for p in s.detail.get("params", [])]
    if len(params) < 2:
        return []
    optimizer = s.detail.get("optimizer") or "optimizer"
    (owner, _, attr), (tied, _, to) = params[-1].rpartition("."), params[0].rpartition(".")
    return [Finding(
        FindingKind.SHARED_STORAGE, WARNING, c.model_name(s.model), s.fqn, s.step,
        f"the {optimizer} optimizer of model '{c.model_name(s.model)}' holds "
        f"{names_text(params)}, {plural(len(params), 'different Parameter')} over one "
        "storage (weights tied by assigning .data, or Parameters made from one tensor): "
        "each has its own gradient, and each step updates the shared tensor "
        + ("twice" if len(params) == 2 else f"{len(params)} times") + ", once with each",
        {"params": params, "optimizer": optimizer},
        f"tie the Parameter itself ({owner or 'model'}.{attr} = {tied or 'model'}.{to}): one "
        "Parameter in both modules, which model.parameters() and the optimizer hold once")]


def twice_text(c: Collected) -> str:
    """For a model no optimizer steps, where another model's optimizer stepped twice after one
    backward pass (a second step() where this model's was meant): ', while ... steps twice'."""
    twice = sorted({(c.model_name(s.model), str(s.detail.get("optimizer") or "optimizer"))
                    for s in c.signals
                    if s.kind == SignalKind.OPTIMIZER_STEPS and stepped_again(s.detail)})
    return "".join(f", while the {cls} optimizer of model '{model}' steps twice after one "
                   "backward pass" for model, cls in twice)


def parametrized_hint(missing: list[str], old_held: bool) -> str:
    """The hint for a parametrization's parameters no optimizer holds (``X.parametrizations.W``
    modules): registered after the optimizer was built (``old_held``: the optimizer holds
    parameters its model no longer has)."""
    names = [name.split(".parametrizations.") for name in missing if ".parametrizations." in name]
    if not names:
        return ""
    owner, tensor = names[0]
    tensor = tensor.split(".")[0]
    old = f"{owner}.{tensor}" if owner else tensor
    return (f"a parametrization (weight_norm, spectral_norm, register_parametrization) "
            f"registered on {old} after the optimizer was built replaces the Parameter {old} "
            f"with new ones (parametrizations.{tensor}.original*) that the optimizer does not "
            "hold" + (f"; the optimizer holds the old {old}, which the model no longer uses"
                      if old_held else "")
            + ": register the parametrization before building the optimizer")


def outside_text(detail: dict[str, Any]) -> str:
    """What the optimizers of a model hold that no module of it has (its ``optimizers``
    signal's ``outside``): '; instead, its optimizer holds 1 parameter ...', or ''."""
    shapes = [list(shape) for shape in detail.get("outside", [])]
    count = int(detail.get("outside_count", len(shapes)))
    if not count:
        return ""
    listed = ", ".join(str(shape) for shape in shapes[:4]) + (
        f" and {count - 4} more" if count > 4 else "")
    return (f"; instead, its optimizer holds {plural(count, 'parameter')} that no module of "
            f"the model has and that {'gets' if count == 1 else 'get'} no gradient ({listed})")
def params_recreated(c: Collected, s: Signal) -> list[Finding]:
    params = s.detail.get("params", [])
    quoted = ", ".join(f"'{p}'" for p in params)
    return [Finding(
        FindingKind.PARAMS_RECREATED, WARNING, c.model_name(s.model), s.fqn, s.step,
        f"{c.label(s.model, s.fqn)} creates a new nn.Parameter {quoted} in its forward at every "
        "call: no optimizer holds it, and it restarts from its initial value each step",
        {"params": params},
        "create it once, in __init__, and use it in forward")]




# signal kind -> (cause, message, hint) of the gradients an optimizer step found: kept from the
# step before, or cleared or zeroed between backward() and step()
_AT_STEP = {
    SignalKind.GRADS_CARRIED_OVER: (
        FindingKind.GRADS_CARRIED_OVER,
        "the gradients of {count} of model '{model}' ({names}) were not cleared after "
        "optimizer.step(): the backward of step {step} adds to the previous step's",
        "call optimizer.zero_grad() once per optimizer step (gradient accumulation: after "
        "each optimizer.step(), not after each micro-batch)"),
    SignalKind.GRADS_CLEARED: (
        FindingKind.GRADS_CLEARED,
        "optimizer.step() after step {step} found every gradient of model '{model}' already "
        "cleared ({count} the backward reached: {names}): zero_grad() ran between backward() "
        "and step(), so the weights do not change",
        "order the loop as optimizer.zero_grad(); loss.backward(); optimizer.step()"),
    SignalKind.GRADS_ZEROED: (
        FindingKind.GRADS_ZEROED,
        "optimizer.step() after step {step} found every gradient of model '{model}' exactly "
        "zero, though its backward gave {count} ({names}) non-zero ones: they were zeroed "
        "between backward() and step(), so the weights do not change",
        "clip_grad_norm_ with max_norm=0 (it does not mean off: leave the call out), or "
        "zero_grad() between backward() and step(): order the loop as "
        "optimizer.zero_grad(); loss.backward(); optimizer.step()"),
}


def at_step(c: Collected, s: Signal) -> list[Finding]:
    """Gradients an optimizer step found carried over, cleared or zeroed (``_AT_STEP``); zeroed
    only where the backward of that step gave them non-zero norms (without a ``params`` record
    of it, taken as given: a loss of 0 gives zero gradients itself)."""
    cause, message, hint = _AT_STEP[s.kind]
    modules = sorted(s.detail.get("modules", []), key=lambda name: c.first_seq(s.model, name))
    if s.kind == SignalKind.GRADS_ZEROED:
        at = norms_at(c, s.model, s.step)
        norms = [at[name] for name in modules if name in at]
        if norms and not any(norms):
            return []
    return [Finding(
        cause, WARNING, c.model_name(s.model), modules[0] if modules else "", s.step,
        message.format(count=plural(len(modules), "module"), model=c.model_name(s.model),
                       names=names_text(modules), step=s.step),
        {"modules": modules}, hint)]

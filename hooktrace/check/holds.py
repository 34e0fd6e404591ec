"""What the optimizer holds versus what the model is: a module set on a wrapper (``DataParallel``,
DDP, ``torch.compile``'s) instead of the model it wraps, never run; two Parameters over one
storage in one optimizer (weights tied through ``.data``), each stepped; an optimizer stepped
again with no backward pass between; and, for the ``not-optimized`` finding, the parameters an
optimizer holds that no module of its model has any more (a parametrization registered after the
optimizer was built replaced them). Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text, steps_text
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn
    from hooktrace.log.schema import Signal

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
    first, second = params[-1], params[0]
    return [Finding(
        FindingKind.SHARED_STORAGE, WARNING, c.model_name(s.model), s.fqn, s.step,
        f"the {optimizer} optimizer of model '{c.model_name(s.model)}' holds "
        f"{names_text(params)}, {plural(len(params), 'different Parameter')} over one "
        "storage (weights tied by assigning .data, or Parameters made from one tensor): "
        "each has its own gradient, and each step updates the shared tensor "
        + ("twice" if len(params) == 2 else f"{len(params)} times") + ", once with each",
        {"params": params, "optimizer": optimizer},
        f"tie the Parameter itself ({_owner(first)}.{_attr(first)} = "
        f"{_owner(second)}.{_attr(second)}): one Parameter in both modules, which "
        "model.parameters() and the optimizer hold once")]


def _owner(param: str) -> str:
    return param.rpartition(".")[0] or "model"


def _attr(param: str) -> str:
    return param.rpartition(".")[2]


def stepped_again(detail: dict[str, Any]) -> bool:
    """Whether an optimizer (its ``optimizer-steps`` facts) stepped again with no backward pass
    since its last step in two steps or more, half of those looked at or more."""
    again = detail.get("again") or {}
    count = int(again.get("count", 0))
    return count >= 2 and 2 * count >= int(again.get("of", 0))


def stepped_twice(c: Collected, s: Signal) -> list[Finding]:
    """An optimizer that stepped again with no backward pass since its last step (its
    ``optimizer-steps`` facts): each step applies the same gradients again."""
    if not stepped_again(s.detail):
        return []
    optimizer = s.detail.get("optimizer") or "optimizer"
    steps = [int(x) for x in s.detail["again"].get("steps", [])]
    most = int(s.detail["again"].get("most", 2))
    model = c.model_name(s.model)
    times = "twice" if most == 2 else f"{most} times"
    return [Finding(
        FindingKind.STEPPED_TWICE, WARNING, model, "", steps[0],
        f"the {optimizer} optimizer of model '{model}' stepped {times} after one backward "
        f"pass, in {steps_text(steps)}: each step applies the same gradients again (about "
        f"{most}x the learning rate)",
        {"optimizer": optimizer, "steps": steps, "most": most},
        "call optimizer.step() once per backward (once per accumulation cycle); a second "
        "step() where another optimizer's should be is a copy-paste slip")]


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

"""Findings on updates that do not happen or do harm: weights that never change, updates that
round away in half precision, a learning rate scheduled down to nothing, a weight decay that
shrinks every weight. Each reads one ``signal`` record of the observers that watch the weights.
Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal


def modules_not_held(c: Collected, model: int) -> set[str]:
    """The modules of ``model`` whose trainable parameters no optimizer that stepped holds, as
    the model's last ``optimizers`` signal says (``loop.not_held`` says them)."""
    optimizers = [t for t in c.signals if t.model == model and t.kind == SignalKind.OPTIMIZERS]
    return set(optimizers[-1].detail.get("not_held", [])) if optimizers else set()


def weights_unchanged(c: Collected, s: Signal) -> list[Finding]:
    """A model whose weights got non-zero gradients and never changed: why, from what else
    the loop did (a cause another finding names is left to it)."""
    model = s.model
    if any(t.model == model and t.kind in (SignalKind.GRADS_CLEARED, SignalKind.GRADS_ZEROED)
           for t in c.signals):
        return []
    not_held = modules_not_held(c, model)
    modules = [name for name in s.detail.get("modules", []) if name not in not_held]
    norms = norms_at(c, model, s.step)
    if norms:  # with statistics: only gradients that were not zero count
        modules = [name for name in modules if norms.get(name)]
    if not modules:
        return []
    steps, lrs, through = (s.detail.get("optimizer_steps", 0), s.detail.get("lr", []),
                           s.detail.get("through", s.step))
    if steps == 0:
        if any(t.model == model and t.kind == SignalKind.EVAL_BACKWARD for t in c.signals):
            return []  # gradients of a model in eval mode, no optimizer: an analysis
        cause, hint = "no optimizer.step() ran", "call optimizer.step() after loss.backward()"
    elif lrs and not any(lrs):
        cause = "the optimizer's learning rate is 0"
        hint = "give the optimizer a learning rate above 0 (a schedule may start at 0, not stay)"
    elif lrs and max(lrs) < 1e-7:
        cause = f"the learning rate ({max(lrs):.0e}) is too small to change float32 weights"
        hint = "raise the learning rate; float32 cannot hold updates below ~1e-7 of a weight"
    elif s.detail.get("dtype"):
        cause = (f"the weights are {s.detail['dtype']}: each update (learning rate x "
                 "gradient) is below their precision and rounds away")
        hint = ("keep the weights in float32 (no model.half()) and train under "
                "torch.autocast(dtype=torch.float16) with torch.amp.GradScaler, which also keeps "
                "small gradients from underflowing to 0")
    else:
        cause = (f"optimizer.step() ran in {plural(steps, 'step')} and left them as they were: "
                 "their gradients were zero when it ran")
        hint = ("clip_grad_norm_(..., max_norm=0) and clip_grad_value_(..., 0) zero every "
                "gradient (0 does not turn clipping off), as do zero_grad(set_to_none=False) or "
                "p.grad.zero_() between backward() and step()")
    return [Finding(
        FindingKind.WEIGHTS_UNCHANGED, WARNING, c.model_name(model), "", s.step,
        f"the weights of model '{c.model_name(model)}' did not change from step {s.step} to "
        f"step {through} though they got gradients ({plural(len(modules), 'module')}: "
        f"{names_text(modules)}): {cause}",
        {"modules": modules, "optimizer_steps": steps, "lr": lrs}, hint)]


def updates_rounded(c: Collected, s: Signal) -> list[Finding]:
    """Half-precision weights whose updates round away: most do not move though their
    gradients are not zero (all of them unmoved is ``weights-unchanged``'s)."""
    if any(t.model == s.model and t.kind == SignalKind.WEIGHTS_UNCHANGED for t in c.signals):
        return []
    d = s.detail
    dtype, moved, compared = d.get("dtype", "?"), d.get("moved", 0), d.get("compared", 0)
    lrs = d.get("lr") or []
    lr = f" (learning rate {max(lrs):.3g})" if lrs else ""
    return [Finding(
        FindingKind.UPDATES_ROUNDED, WARNING, c.model_name(s.model), "", s.step,
        f"the {dtype} weights of model '{c.model_name(s.model)}' barely change: from step "
        f"{s.step} to step {d.get('through', '?')}, {moved} of {compared} sampled weights with "
        f"a non-zero gradient moved: each update{lr} is below a {dtype} weight's precision "
        "and rounds back to it", {k: d[k] for k in ("moved", "compared", "dtype", "lr") if k in d},
        "keep the weights in float32 and train under torch.autocast(dtype=torch.bfloat16 or "
        "torch.float16) so the optimizer updates float32 master weights; a larger learning rate "
        "only hides it")]


def lr_collapsed(c: Collected, s: Signal) -> list[Finding]:
    """An optimizer that spent half its steps or more with a learning rate below 1e-4 of its
    peak, or got there by one constant factor at each step (``detail.factor``): a schedule
    meant per epoch stepped per batch."""
    d = s.detail
    low, steps = d.get("low_steps", 0), d.get("optimizer_steps", 0)
    factor = d.get("factor")
    fell = f", multiplied by {factor:.2g} at every optimizer step," if factor else ""
    evidence = {"peak": d.get("peak"), "lr": d.get("lr"), "low_steps": low,
                "optimizer_steps": steps}
    if factor:
        evidence["factor"] = factor
    return [Finding(
        FindingKind.LR_COLLAPSED, WARNING, c.model_name(s.model), "", s.step,
        f"the learning rate of the optimizer of model '{c.model_name(s.model)}'{fell} fell "
        f"below 1e-4 of its peak ({d.get('peak', 0):.3g}) at step {s.step} and stepped {low} of "
        f"its {steps} steps there (last {d.get('lr', 0):.2g}): from then on the weights hardly "
        "change", evidence,
        "a scheduler meant to step once per epoch (StepLR, MultiStepLR, ExponentialLR) "
        "stepped once per batch: call scheduler.step() after each epoch, or give it a "
        "step_size in batches")]


def weight_decay(c: Collected, s: Signal) -> list[Finding]:
    """A weight decay that takes 1% or more of every weight at each step."""
    lr, wd = s.detail.get("lr", 0.0), s.detail.get("weight_decay", 0.0)
    shrink = lr * wd
    return [Finding(
        FindingKind.WEIGHT_DECAY, WARNING, c.model_name(s.model), "", s.step,
        f"the weight decay of the {s.detail.get('optimizer', '?')} optimizer of model "
        f"'{c.model_name(s.model)}' takes {min(shrink, 1.0):.0%} of every weight at each step "
        f"(lr {lr:.3g} x weight_decay {wd:.3g}): the weights shrink toward 0 whatever the "
        "gradients say", {"lr": lr, "weight_decay": wd},
        "weight_decay is usually 1e-4 to 0.1 (a typo such as 5 for 5e-4?): lr x weight_decay "
        "is the fraction of each weight the decay removes per step")]


def norms_at(c: Collected, model: int, step: int) -> dict[str, float | None]:
    """The parameter-gradient norm of each of ``model``'s modules in ``step``'s params
    records (empty without statistics)."""
    return {name: norm for m, names, norms in c.param_norms.get(step, []) if m == model
            for name, norm in zip(names, norms, strict=True)}


def params_unmoved(c: Collected, s: Signal) -> list[Finding]:
    """The parameter ledger's parameters that never moved (``params-unmoved``), where the
    optimizer steps since say why: held by no optimizer that stepped (a bias left out of the
    groups), or held but with no ``.grad`` at any of its steps (set to None between backward
    and step). Not said again of a module another finding names (a module no optimizer holds,
    a model whose weights never change), nor where the steps do not say why (an lr of 0 in a
    warm-up, a zero gradient: other findings' to tell)."""
    said = {t.model for t in c.signals if t.kind == SignalKind.WEIGHTS_UNCHANGED}
    if s.model in said:
        return []
    not_held = modules_not_held(c, s.model)
    params = [p for p in s.detail.get("params") or () if isinstance(p, dict)
              and p.get("param", "").rpartition(".")[0] not in not_held]
    free = [p for p in params if p.get("held") == 0]
    cleared = [p for p in params if p.get("held", 0) > 0 and p.get("grads") == 0]
    out = []
    for found, cause, what, hint in (
            (free, FindingKind.NOT_OPTIMIZED, "no optimizer that stepped holds them",
             "add them to the optimizer (a parameter group left out: model.parameters(), not "
             "a filtered list)"),
            (cleared, FindingKind.GRADS_CLEARED, "their .grad was None at every optimizer step "
             "that holds them (cleared between backward and step)",
             "clear gradients before backward (optimizer.zero_grad()), not between backward "
             "and step; a layer frozen on purpose for the first epochs trains after them")):
        if found:
            names = [p["param"] for p in found]
            model = c.model_name(s.model)
            out.append(Finding(
                cause, WARNING, model, names[0].rpartition(".")[0], found[0].get("since"),
                f"{names_text(names)} ({plural(len(names), 'parameter')} of model '{model}') "
                f"never moved through {_steps(found[0].get('steps'))}: {what}",
                {"params": names[:20]}, hint))
    return out


def _steps(counted: object) -> str:
    """The optimizer steps a ledger entry was counted in: the ledger counts 16 at most."""
    return f"{counted} optimizer steps" + (" or more" if counted == 16 else "")

"""Findings on updates that do not happen or do harm, from the parameter ledger's facts
(``observe/ledger.py``): weights that never change, parameters that never move, updates that
round away in half precision, a learning rate scheduled down to nothing, a weight decay that
shrinks every weight. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

STEPPED = 2  # passes an optimizer stepped after, unchanged: one step at lr 0 is a warm-up's first
CHANGED = 0.25  # a compared step that changes this share of the sampled half weights trains
COMPARED_STEPS, COMPARED = 2, 100  # compared steps, and sampled elements over them, to say so
LR_FLOOR = 1e-4  # of the peak learning rate: updates this much smaller change next to nothing
#: a learning rate multiplied by the same factor, GEOMETRIC or less, at each of GEOMETRIC_RUN
#: optimizer steps in a row or more down to below LR_FLOOR: a per-epoch schedule per batch
GEOMETRIC, GEOMETRIC_RUN = 0.5, 3
DECAY_SHRINK = 0.01  # lr * weight_decay: 1% of every weight a step (SGD 0.1 x 5e-4: 5e-5)


def modules_not_held(c: Collected, model: int) -> set[str]:
    """The modules of ``model`` whose trainable parameters no optimizer that stepped holds, as
    the model's last ``optimizers`` signal says (``loop.not_held`` says them)."""
    optimizers = [t for t in c.signals if t.model == model and t.kind == SignalKind.OPTIMIZERS]
    return set(optimizers[-1].detail.get("not_held", [])) if optimizers else set()


def _lrs_between(c: Collected, start: int, end: int) -> list[float]:
    """The learning rates of the optimizer steps the ledger kept that came after a pass from
    ``start`` up to ``end`` (not included)."""
    return sorted({lr for s in c.signals if s.kind == SignalKind.OPTIMIZER_LRS
                   for after, lr in zip(s.detail.get("after", []), s.detail.get("lr", []),
                                        strict=False)
                   if lr is not None and start <= after < end})


def unchanged(c: Collected, s: Signal) -> tuple[int, int] | None:
    """Where the ledger (``s``, a ``params-unmoved`` signal) says no trainable parameter of the
    model that got a gradient ever moved: (the step it says so through, the passes an optimizer
    stepped after between): the first look after ``STEPPED`` such passes, or with no optimizer
    step in the run, the last look where its gradients were cleared between looks (a loop meant
    to train; gradients only added to are an analysis). None where one moved or too few
    steps ran between looks."""
    d = s.detail
    looks = d.get("looks") or []
    if d.get("moved") or not looks:
        return None
    base = looks[0][1]
    for step, passes in looks:
        if passes - base >= STEPPED:
            return step, passes - base
    last = max((p.get("through", s.step) for p in d.get("params") or ()), default=s.step)
    if (d.get("cleared") and last > s.step
            and not any(t.kind == SignalKind.OPTIMIZER_LRS for t in c.signals)):
        return last, 0
    return None


def weights_unchanged(c: Collected, s: Signal, through: int, steps: int) -> list[Finding]:
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
    lrs = _lrs_between(c, s.step, through)
    half = [d for d in s.detail.get("dtypes", []) if d in ("float16", "bfloat16")]
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
    elif half:
        cause = (f"the weights are {half[0]}: each update (learning rate x gradient) is below "
                 "their precision and rounds away")
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
    """Half-precision weights whose updates round away (a ``half-updates`` signal): under
    ``CHANGED`` of the sampled weights with a non-zero gradient moved at each compared step,
    ``COMPARED`` or more of them over ``COMPARED_STEPS`` steps or more (all of them unmoved is
    ``weights-unchanged``'s)."""
    if any(t.model == s.model and t.kind == SignalKind.PARAMS_UNMOVED and unchanged(c, t)
           for t in c.signals):
        return []
    d = s.detail
    dtype, steps, moved, compared = d.get("dtype", "?"), 0, 0, 0
    for _, through, moved_now, should in d.get("compared", []):  # noqa: B007 (said after)
        if should and moved_now >= CHANGED * should:
            return []  # it trains
        steps, moved, compared = steps + 1, moved + moved_now, compared + should
        if steps >= COMPARED_STEPS and compared >= COMPARED:
            break
    else:
        return []
    lrs = _lrs_between(c, -1, through)
    lr = f" (learning rate {max(lrs):.3g})" if lrs else ""
    return [Finding(
        FindingKind.UPDATES_ROUNDED, WARNING, c.model_name(s.model), "", s.step,
        f"the {dtype} weights of model '{c.model_name(s.model)}' barely change: from step "
        f"{s.step} to step {through}, {moved} of {compared} sampled weights with "
        f"a non-zero gradient moved: each update{lr} is below a {dtype} weight's precision "
        "and rounds back to it", {"moved": moved, "compared": compared, "dtype": dtype,
                                  "lr": lrs},
        "keep the weights in float32 and train under torch.autocast(dtype=torch.bfloat16 or "
        "torch.float16) so the optimizer updates float32 master weights; a larger learning rate "
        "only hides it")]


def optimizer_lrs(c: Collected, s: Signal) -> list[Finding]:
    """An optimizer's learning rates (an ``optimizer-lrs`` signal): a schedule collapsed, a
    weight decay that shrinks every weight; for each model of its parameters."""
    out: list[Finding] = []
    collapsed = collapse(s.detail)
    decay = s.detail.get("decay")
    for model in s.detail.get("models", [s.model]):
        if collapsed is not None:
            out += lr_collapsed(c, model, *collapsed)
        if decay and decay["lr"] * decay["weight_decay"] >= DECAY_SHRINK:
            out += weight_decay(c, model, max(decay["step"], 0), decay, s.detail)
    return out


def collapse(d: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """Where an optimizer stepped half its steps or more with a learning rate below
    ``LR_FLOOR`` of its peak so far, or got there by one factor of ``GEOMETRIC`` or less at
    each of ``GEOMETRIC_RUN`` steps in a row or more: (the pass it first did after, the
    evidence). A sampled step stands for the ``every`` steps up to it."""
    every, count = d.get("every", 1), d.get("count", 0)
    sampled = (count - 1) // every + 1 if count else 0
    lrs = d.get("lr", [])
    indices = [i * every for i in range(sampled)] + [count - 1] * (len(lrs) > sampled)
    peak = last = ratio = factor = 0.0
    steps = low = run = 0
    low_from, before = None, -1
    for index, after, lr in zip(indices, d.get("after", []), lrs, strict=False):
        gap, before = index - before, index
        if lr is None:
            continue
        steps += gap
        if last > 0 and 0 < lr <= GEOMETRIC ** gap * last:
            now = (lr / last) ** (1 / gap)
            run = run + 1 if ratio and abs(now - ratio) <= 1e-3 * ratio else 1
            ratio = now
        else:
            run, ratio = 0, 0.0
        peak, last = max(peak, lr), lr
        if lr < LR_FLOOR * peak:
            low += gap
            if low_from is None:
                low_from = max(after, 0)
                factor = ratio if run >= GEOMETRIC_RUN else 0.0
    if low_from is None or (2 * low < steps and not factor):
        return None
    evidence: dict[str, Any] = {"peak": peak, "lr": last, "low_steps": low,
                                "optimizer_steps": steps}
    if factor:
        evidence["factor"] = factor
    return low_from, evidence


def lr_collapsed(c: Collected, model: int, step: int, d: dict[str, Any]) -> list[Finding]:
    """An optimizer that spent half its steps or more with a learning rate below 1e-4 of its
    peak, or got there by one constant factor at each step (``d["factor"]``): a schedule
    meant per epoch stepped per batch."""
    low, steps, factor = d["low_steps"], d["optimizer_steps"], d.get("factor")
    fell = f", multiplied by {factor:.2g} at every optimizer step," if factor else ""
    return [Finding(
        FindingKind.LR_COLLAPSED, WARNING, c.model_name(model), "", step,
        f"the learning rate of the optimizer of model '{c.model_name(model)}'{fell} fell "
        f"below 1e-4 of its peak ({d['peak']:.3g}) at step {step} and stepped {low} of "
        f"its {steps} steps there (last {d['lr']:.2g}): from then on the weights hardly "
        "change", dict(d),
        "a scheduler meant to step once per epoch (StepLR, MultiStepLR, ExponentialLR) "
        "stepped once per batch: call scheduler.step() after each epoch, or give it a "
        "step_size in batches")]


def weight_decay(c: Collected, model: int, step: int, decay: dict[str, Any],
                 d: dict[str, Any]) -> list[Finding]:
    """A weight decay that takes 1% or more of every weight at each step."""
    lr, wd = decay["lr"], decay["weight_decay"]
    return [Finding(
        FindingKind.WEIGHT_DECAY, WARNING, c.model_name(model), "", step,
        f"the weight decay of the {d.get('optimizer', '?')} optimizer of model "
        f"'{c.model_name(model)}' takes {min(lr * wd, 1.0):.0%} of every weight at each step "
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
    and step); where none of the model's parameters moved, ``weights-unchanged``. Not said
    again of a module another finding names (a module no optimizer holds), nor where the
    steps do not say why (an lr of 0 in a warm-up, a zero gradient: other findings' to
    tell)."""
    still = unchanged(c, s)
    if still is not None:
        return weights_unchanged(c, s, *still)
    not_held = modules_not_held(c, s.model)
    params = [p for p in s.detail.get("params") or () if isinstance(p, dict) and p.get(
        "steps", 0) >= 2 and p.get("param", "").rpartition(".")[0] not in not_held]
    free = [p for p in params if p.get("held") == 0]
    cleared = [p for p in params if p.get("held", 0) > 0 and p.get("grads") == 0]
    out: list[Finding] = []
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

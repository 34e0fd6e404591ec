"""Updates that do not happen or do harm, from the parameter ledger's facts
(``observe/ledger.py``) and the loss scaler's: weights that never change, parameters that never
move, updates that round away in half precision, a learning rate scheduled down to nothing, a
weight decay that shrinks every weight, gradients stepped still multiplied by the loss scale
(the NaN/Inf and growing gradients that follow are said as its consequence), or clipped before
they were unscaled. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import ERROR, WARNING, Finding, FindingKind, names_text
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
    """The modules of ``model`` no optimizer that stepped holds (``holds.not_held`` says them)."""
    optimizers = [t for t in c.signals if t.model == model and t.kind == SignalKind.OPTIMIZERS]
    return set(optimizers[-1].detail.get("not_held", [])) if optimizers else set()


def _lrs_between(c: Collected, start: int, end: int) -> list[float]:
    """The learning rates of the optimizer steps after a pass in [``start``, ``end``)."""
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
    """A schedule collapsed, a weight decay that shrinks every weight (``optimizer-lrs``)."""
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
    """Each of ``model``'s modules' parameter-gradient norm at ``step`` (none: no statistics)."""
    return {name: norm for m, names, norms in c.param_norms.get(step, []) if m == model
            for name, norm in zip(names, norms, strict=True)}


def params_unmoved(c: Collected, s: Signal) -> list[Finding]:
    """The ledger's parameters that never moved (``params-unmoved``), where the steps say why:
    held by no optimizer that stepped, or held with no ``.grad`` at any of its steps; none of
    the model's: ``weights-unchanged``. Not where another finding names the module, nor where
    the steps do not say why (an lr of 0 in a warm-up, a zero gradient)."""
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
            counted = found[0].get("steps")
            more = " or more" if counted == 16 else ""  # the ledger counts 16 steps at most
            out.append(Finding(
                cause, WARNING, model, names[0].rpartition(".")[0], found[0].get("since"),
                f"{names_text(names)} ({plural(len(names), 'parameter')} of model '{model}') "
                f"never moved through {counted} optimizer steps{more}: {what}",
                {"params": names[:20]}, hint))
    return out


# findings that gradients too large by the scale explain, in the same model from its step on
_CONSEQUENCES = (FindingKind.NONFINITE_FORWARD, FindingKind.NONFINITE_BACKWARD, "exploding")


def check_scaling(c: Collected) -> list[Finding]:
    """A loss multiplied by the ``GradScaler``'s scale twice (``loss-scaled``), once a model."""
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

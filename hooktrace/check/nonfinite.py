"""The first NaN/Inf of a run, forward and backward, as findings, with why a forward output
turned NaN/Inf (gradients an optimizer applied, a float16 overflow, training that diverges) and
when NaN/Inf gradients are a loss scaler's skipped steps. Pure: a ``Collected`` in; which call
came first is one rule (below), applied while collecting."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hooktrace.check.collected import Collected, Nonfinite
from hooktrace.check.findings import (
    ERROR,
    NOTE,
    WARNING,
    Finding,
    FindingKind,
    names_text,
    steps_text,
)
from hooktrace.check.magnitudes import DIVERGES, growth, growth_text, largest_norms
from hooktrace.log import schema
from hooktrace.log.decoder import Stats
from hooktrace.log.names import ancestors
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import AnomalyKind, SignalKind
from hooktrace.log.words import fqn_text


def check_nonfinite(c: Collected) -> list[Finding]:
    out = []
    forward = c.forward_nan.first
    backward = c.backward_nan.first
    if forward is not None:
        later = sorted(c.forward_nan.steps - {forward.step})
        why, hint = _forward_cause(c, forward, backward.step if backward else None)
        module, evidence = forward.fqn, forward.evidence
        came = _came_in(c, forward)
        severity = ERROR
        if came is not None and not (backward is not None and backward.step < forward.step):
            module, why, hint, more = came
            evidence = {**evidence, **more}
            if backward is None and "received_by" not in more:  # with the data, read by no loss
                severity, why = NOTE, why + (
                    "; no gradient of the run was NaN/Inf: no loss that trains read it (a FLOPs "
                    "probe on torch.empty, a terminal observation masked out with torch.where)")
        out.append(Finding(
            FindingKind.NONFINITE_FORWARD, severity, c.model_name(forward.model), module,
            forward.step,
            f"first NaN/Inf in a forward output: {c.label(forward.model, forward.fqn)} at "
            f"step {forward.step}" + (f" (again in {steps_text(later)})" if later else "") + why,
            evidence, hint))
    if backward is None:
        return out if forward else _loss_nonfinite(c)
    produced = backward.evidence.get("produced")
    label = c.label(backward.model, backward.fqn)
    if forward is None and _recovered(c):
        bad = sorted(c.backward_nan.steps)
        out.append(Finding(
            FindingKind.NONFINITE_BACKWARD, NOTE, c.model_name(backward.model), backward.fqn,
            backward.step,
            f"NaN/Inf gradients in {steps_text(bad)}, first "
            f"{'produced by' if produced else 'reaching'} {label}; "
            "every forward output finite, and finite gradients in the steps after: those "
            "steps' updates were skipped, as a loss scaler (torch.amp.GradScaler) skips a step "
            "whose scaled gradients overflowed", {**backward.evidence, "steps": bad[:20]},
            "expected with fp16 loss scaling, in its first steps and now and then after; "
            "without a scaler, find where the NaN/Inf starts in those steps",
        ))
    else:
        follows = forward is not None and forward.step <= backward.step
        out.append(Finding(
            FindingKind.NONFINITE_BACKWARD, ERROR, c.model_name(backward.model), backward.fqn,
            backward.step,
            f"first NaN/Inf gradient {'produced by' if produced else 'reached'} {label} at step "
            f"{backward.step}" + (" (follows from the forward NaN/Inf)" if follows else ""),
            {**backward.evidence, "follows": FindingKind.NONFINITE_FORWARD} if follows else
            backward.evidence,
            "fix the forward NaN/Inf first" if follows else
            "its backward turned finite gradients into NaN/Inf (sqrt or log near 0, division by "
            "a tiny norm; torch.where does not stop the gradient of the branch it does not "
            "pick: clamp the input, torch.sqrt(x.clamp(min=1e-12)))" if produced else
            "the gradient was NaN/Inf when it reached this module: it comes from the loss or "
            "from functional code after the last module",
        ))
    return out


def _loss_nonfinite(c: Collected) -> list[Finding]:
    """The loss ledger's NaN/Inf values (``loss-values``: null) from its first pass on, the
    untrained model's (not a loss that grew into Inf: a run that diverges), where every module
    output and every gradient the log holds was finite: functional code between the model's
    outputs and the loss made them (a target whose log-probability is -inf, a log of 0)."""
    # the steps whose loss read no target (a mean of nothing): loss-reads-nothing tells them
    empty = {s.step for s in c.signals if s.kind == SignalKind.LOSS_SHARE and not s.detail.get(
        "read", 1)}
    out = []
    for s in c.signals:
        values, steps = s.detail.get("values") or [], s.detail.get("steps") or []
        bad = [step for step, v in zip(steps, values, strict=False) if v is None]
        if (s.kind == SignalKind.LOSS_VALUES and values[:1] == [None]
                and len(steps) == len(values) and not set(bad) <= empty):
            name = c.model_name(s.model)
            out.append(Finding(
                FindingKind.NONFINITE_FORWARD, WARNING, name, "", bad[0],
                f"the loss of model '{name}' was NaN/Inf in {steps_text(bad)} of the "
                f"{len(steps)} the ledger holds, while every module output and gradient was "
                "finite: functional code between the model's outputs and the loss made it",
                {"steps": bad[:20], "passes": len(steps)},
                "look for a log of 0 or a target whose score is -inf (a masked logit: a label "
                "that points at a masked-out column) in the loss code"))
    return out


def _came_in(c: Collected, forward: Nonfinite
             ) -> tuple[str, str, str, dict[str, Any]] | None:
    """Where a first NaN/Inf output whose call got it in its inputs (``nonfinite-inputs``) was
    made: in the forward of the innermost call around both it and the call that returned
    just before it (a NaN born in a module's own functional code is that module's, not the
    child's that received it), or before the model's first call of the step (the data). Its
    module, the words, the hint and the evidence; None where its inputs were finite."""
    said = next((s for s in c.signals if s.kind == SignalKind.NONFINITE_INPUTS and (
        s.step, s.model, s.fqn) == (forward.step, forward.model, forward.fqn)), None)
    if said is None:
        return None
    model, fqn = forward.model, forward.fqn
    before = c.forward_first_before
    if before is None or before[0] != model:
        return (fqn, ", whose input already held NaN/Inf when model "
                f"'{c.model_name(model)}' began the step: it came with the data, or from the "
                "code before the model's call", "check the batch (torch.isfinite(x).all()) and "
                "what the script computes from it before the model",
                {"inputs": said.detail.get("inputs")})
    around = [a for a in ancestors(fqn) if a == "" or before[1] == a
              or before[1].startswith(a + ".")]
    made = around[-1] if around else ""
    between = [a for a in ancestors(fqn) if len(a) > len(made) and a != fqn and (
        made == "" or a.startswith(made + "."))]
    also = (f" (or in the forward of {names_text(between)} before it calls {fqn})"
            if between else "")
    return (made, f", whose input already held NaN/Inf: made in the forward of "
            f"{c.label(model, made)}, by its own code after {fqn_text(before[1])} returned "
            f"and before {fqn} was called{also}",
            f"look in the forward of {fqn_text(made)} between {fqn_text(before[1])} and "
            f"{fqn}: log or sqrt of <= 0, division by 0, exp overflowing, a softmax over a row "
            "masked entirely with -inf",
            {"inputs": said.detail.get("inputs"), "received_by": fqn, "after": before[1]})


def _forward_cause(c: Collected, forward: Nonfinite, backward: int | None) -> tuple[str, str]:
    """Why a forward output turned NaN/Inf: NaN/Inf gradients of an earlier step that an
    optimizer applied, a float16 overflow, weights blown up by growing updates
    (parameter-gradient norms up by 3 orders of magnitude or more since the first step), else
    something in its forward."""
    step = forward.step
    if backward is not None and backward < step:
        return (f", after the NaN/Inf gradients of step {backward}",
                f"an optimizer step applied the NaN/Inf gradients of step {backward} to the "
                "weights: fix where they start (the nonfinite-backward finding); "
                "torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True) stops such steps")
    weights, dtypes = _nonfinite_weights(c, forward)
    if weights:
        held = f": its own weights ({', '.join(weights)}) already held NaN/Inf when it ran"
        before = [s for s in c.backward_steps if s < step]
        if not before:  # nothing in the log changed them: they came so
            return (held + ", at the first step the log holds: they were initialised, loaded or "
                    "changed so before it", "check the checkpoint or the initialisation "
                    "(torch.isfinite(p).all() for each parameter) before training")
        half = "float16" in dtypes or "bfloat16" in dtypes
        since = max(before)
        made = f"the update after step {since} made them so"
        if forward.evidence.get("compiled") and step - 1 > since:  # the watch judged those
            made = (f"steps {since + 1}-{step - 1} ran compiled, their gradients finite too: "
                    f"the update after step {step - 1}, or code run before step {step}, made "
                    "them so")
        return (held + f", though every gradient before was finite: {made}",
                "keep the weights in float32 and train with torch.autocast and "
                "torch.amp.GradScaler: in float16, Adam's eps=1e-8 rounds to 0 (an update of "
                "0/0 where a gradient is 0) and updates overflow; or set eps=1e-4" if half else
                "the update itself overflowed: lower the learning rate, check the optimizer's "
                "eps and weight_decay, clip the gradients (torch.nn.utils.clip_grad_norm_)")
    if _overflowed(c, forward):
        grew = growth(c, before=step, factor=10)
        norms = [f"{v:.3g}" for v in largest_norms(c, step).values()]
        return (": a float16 overflow (Inf past 65504, no NaN, from finite inputs)" + (
                    f", after the largest parameter-gradient norm grew "
                    f"{grew[3] / grew[1]:.0f}x over steps {grew[0]}-{grew[2]} ("
                    + " -> ".join(norms if len(norms) <= 4 else [norms[0], "...", norms[-1]])
                    + ")" if grew else ""),
                "normalise the inputs and lower the learning rate, or keep the weights in "
                "float32 and train with torch.autocast(dtype=torch.float16) and "
                "torch.amp.GradScaler")
    grown = growth(c, before=step)
    if grown is not None:
        return f", after {growth_text(grown)}", DIVERGES
    return ("", "the modules before it gave finite outputs: look inside its forward, or at the "
                "functional code that feeds it (log or sqrt of <= 0, division by 0, fp16 "
                "overflow, a softmax over a row masked entirely with -inf: an attention mask "
                "that hides every key, exp overflowing in a softmax that does not subtract the "
                "max)")


def _nonfinite_weights(c: Collected, forward: Nonfinite) -> tuple[list[str], set[str]]:
    """The first forward NaN/Inf's module's own parameters that held NaN/Inf when it ran, and
    their dtypes (a watched step's anomaly says so itself; a recorded one, a
    ``nonfinite-weights`` signal)."""
    said = forward.evidence.get("weights")
    if isinstance(said, list):
        return [str(n) for n in said], set(map(str, forward.evidence.get("weights_dtypes") or []))
    for s in c.signals:
        if s.kind == SignalKind.NONFINITE_WEIGHTS and (s.step, s.model, s.fqn) == (
                forward.step, forward.model, forward.fqn):
            return ([str(n) for n in s.detail.get("params") or []],
                    set(map(str, s.detail.get("dtypes") or [])))
    return [], set()


# torch modules whose output from finite inputs and weights is NaN/Inf only by overflow
_PRODUCTS = {"Linear", "LazyLinear", "Bilinear", *(f"{lazy}Conv{t}{d}d" for lazy in ("", "Lazy")
                                                   for t in ("", "Transpose") for d in (1, 2, 3))}


def _overflowed(c: Collected, forward: Nonfinite) -> bool:
    """The first NaN/Inf in a forward is certainly a float16 overflow: a Linear or Conv whose
    float16 outputs hold Inf and no NaN, after modules whose outputs were finite (bfloat16
    overflows only past float32's range)."""
    m = c.modules.get((forward.model, forward.fqn))
    outputs = forward.evidence.get("outputs") or []
    return m is not None and m.cls in _PRODUCTS and bool(outputs) and all(
        o.get("dtype") == "float16" and o.get("nan") == 0 and (o.get("inf") or 0) > 0
        for o in outputs)


def _recovered(c: Collected) -> bool:
    """A step after the last one with NaN/Inf gradients had finite ones: a recorded step, or
    a watched one (a watched step with NaN/Inf would have written an anomaly)."""
    last = max(c.backward_nan.steps)
    if any(step > last for step in c.backward_steps):
        return True
    watched = TraceOptions.from_header(c.header).watch
    return watched and c.end is not None and c.end.steps > last + 1


# Where NaN/Inf first appear in a log, as ``collect`` finds them: in a forward output, in a
# gradient (received or produced by a module's backward), in a parameter gradient's norm, or in
# a watched step's anomaly record. One rule for all four.


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
    seen = c.forward_nan
    seen.steps.add(step)
    seen.of_step.setdefault(step, module)
    if seen.first is None:
        c.forward_first_before = before
        seen.first = Nonfinite(step, *module, {
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
        seen = c.backward_nan
        seen.steps.add(step)
        seen.of_step.setdefault(step, (module, produced))
        if seen.first is None:
            seen.first = Nonfinite(step, *module, {
                "call": call, "produced": produced, "grad_output": _counts(outs),
                "grad_input": _counts(ins)})


def parameter_norms(c: Collected, r: schema.ParamGrads) -> None:
    """A params record: a norm that is not finite is a NaN/Inf produced."""
    # the sum is finite when every norm is: the exact test only runs when it is not
    if not math.isfinite(sum(filter(None, r.grad_norm.values()))) and any(
            v is not None and not math.isfinite(v) for v in r.grad_norm.values()):
        c.backward_nan.steps.add(r.step)
        if c.backward_nan.first is None:
            name = next(k for k, v in r.grad_norm.items()
                        if v is not None and not math.isfinite(v))
            c.backward_nan.first = Nonfinite(r.step, r.model, name, {
                "produced": True, "parameter_grad_norm": str(r.grad_norm[name])})


def anomaly(c: Collected, r: schema.Anomaly) -> None:
    """A watched step's record: the same findings as from events, without the events."""
    seen = {AnomalyKind.NONFINITE_FORWARD: c.forward_nan,
            AnomalyKind.NONFINITE_BACKWARD: c.backward_nan}.get(r.kind)
    if seen is not None:
        seen.steps.add(r.step)
        if seen.first is None or r.step < seen.first.step:
            seen.first = Nonfinite(r.step, r.model, r.fqn, {"call": r.call, **r.detail})

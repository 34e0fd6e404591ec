"""The step, explained: optimizer steps that broke an expectation of a training step (the
``step-unexplained`` signals of ``observe/stepcheck.py``), one finding each, saying which
expectation and where: a param group's learning rate, the optimizer's state, gradients cleared
within one accumulation, a gradient's sign. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text, steps_text
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal


def step_unexplained(c: Collected, s: Signal) -> list[Finding]:
    make = _BY_EXPECTATION.get(str(s.detail.get("expectation")))
    if make is None:
        return []
    message, hint = make(c.model_name(s.model), s.detail)
    evidence = {k: v for k, v in s.detail.items() if k != "modules"}
    evidence["modules"] = list(s.detail.get("modules", []))
    return [Finding(FindingKind.STEP_UNEXPLAINED, WARNING, c.model_name(s.model), s.fqn, s.step,
                    message, evidence, hint)]


def _group_lr(model: str, d: dict[str, Any]) -> tuple[str, str]:
    modules = [str(m) for m in d.get("modules", [])]
    count, others = int(d.get("count", 0)), float(d.get("others", 0.0))
    return (
        f"param group {d.get('group', '?')} of the {d.get('optimizer', '?')} optimizer of model "
        f"'{model}' ({names_text(modules)}) stepped at lr 0 in all "
        f"{plural(count, 'step')} it had gradients in, while another group of it stepped at "
        f"lr {others:.3g}: its parameters get gradients and never move",
        "a learning rate set on one param group only: set it on each of them (param_group"
        "['lr'] = lr inside the `for param_group in optimizer.param_groups` loop, or the "
        "scheduler's); to keep those parameters fixed, call requires_grad_(False) on them "
        "instead")


def _state(model: str, d: dict[str, Any]) -> tuple[str, str]:
    cls = d.get("optimizer", "?")
    steps = [int(x) for x in d.get("steps", [])]
    return (
        f"a new {cls} optimizer took over the parameters of model '{model}' "
        f"{plural(int(d.get('count', len(steps))), 'time')} ({steps_text(steps)}), each "
        "time from one that had stepped once or twice: the optimizer is built anew in the "
        "loop, so its state (moments, step count, momentum) starts empty at every step",
        "build the optimizer once, before the training loop, and reuse it (a scheduler, too, "
        "must hold that one)")


def _cleared(model: str, d: dict[str, Any]) -> tuple[str, str]:
    passes, windows = int(d.get("passes", 0)), int(d.get("windows", 1))
    modules = [str(m) for m in d.get("modules", [])]
    return (
        f"the gradients of model '{model}' ({names_text(modules)}) were cleared between "
        f"backward passes of one accumulation: {passes} passes before one optimizer step "
        f"began from no gradient ({plural(windows, 'accumulation')} so), so the step applies "
        "only the last micro-batch's gradient",
        "call optimizer.zero_grad() once per accumulation, after optimizer.step(), not inside "
        "the micro-batch loop")


def _sign(model: str, d: dict[str, Any]) -> tuple[str, str]:
    steps = [int(x) for x in d.get("steps", [])]
    modules = [str(m) for m in d.get("modules", [])]
    return (
        f"the gradients of model '{model}' ({names_text(modules)}) were multiplied by a "
        f"negative factor ({float(d.get('factor', -1.0)):.3g}) between backward() and "
        f"optimizer.step() in {plural(int(d.get('count', len(steps))), 'step')} "
        f"({steps_text(steps)}): the step moves the weights along +g, up the loss",
        "clip_grad_norm_(params, max_norm) scales the gradients by max_norm / norm: a "
        "negative max_norm flips their sign; give it a positive max_norm")


def _update(model: str, d: dict[str, Any]) -> tuple[str, str]:
    cls, verdict, cause = d.get("optimizer", "?"), d.get("verdict"), d.get("cause")
    steps = [int(x) for x in d.get("steps", [])]
    modules = [str(m) for m in d.get("modules", [])]
    count, judged = int(d.get("count", len(steps))), int(d.get("judged", len(steps)))
    where = (f"the {cls} optimizer of model '{model}' ({names_text(modules)})")
    when = f"in {count} of {plural(judged, 'recorded step')} ({steps_text(steps)})"
    if cause == "lr":
        return (f"{where} stepped at a negative learning rate ({float(d.get('lr', 0)):.3g}) "
                f"{when}: each step moved the weights along +g, up the loss",
                "a schedule that goes below 0 (LambdaLR's `1 - step / total` past its last "
                "step, a total too short): clamp its factor with max(0.0, ...) or give it the "
                "run's number of optimizer steps")
    if cause == "maximize":
        return (f"{where} was built with maximize=True: {when} it moved the weights along "
                "+g, up the loss", "drop maximize=True (it is for a loss that is meant to "
                "grow); to ascend one term only, negate that term")
    if cause == "custom":
        return (f"{where} moved the weights along +g {when} (cosine "
                f"{float(d.get('cosine', 0)):.2f} with -g): its update climbs the loss",
                "a sign error in the optimizer's update: p.add_(grad, alpha=lr) where "
                "p.add_(grad, alpha=-lr) is meant")
    said = {"still": "did not move the weights though its lr and their gradient say it "
                     "should",
            "reversed": "moved the weights against the update its kind makes of their "
                        f"gradient, lr and state (cosine {float(d.get('cosine', 0)):.2f})",
            "scaled": f"moved the weights by {float(d.get('ratio', 0)):.3g} times the update "
                      "its kind makes of their gradient, lr and state"}.get(str(verdict), "?")
    return (f"{where} {said} {when}",
            "something changes the weights or their .grad inside optimizer.step() (a step "
            "hook, a wrapper, a .grad swapped for another tensor) or the step works on copies "
            "of the parameters: step the parameters themselves, and change weights after "
            "step() only on purpose")


_BY_EXPECTATION = {"group-lr": _group_lr, "state": _state, "cleared": _cleared,
                   "sign": _sign, "update": _update}

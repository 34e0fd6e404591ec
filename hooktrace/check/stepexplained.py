"""The step, explained: optimizer steps that broke an expectation of a training step (the
``step-unexplained`` signals of ``observe/stepcheck.py``), one finding each, saying which
expectation and where: a param group's learning rate, the optimizer's state, gradients cleared
within one accumulation, a gradient's sign. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, names_text, steps_text
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
    return [Finding("step-unexplained", WARNING, c.model_name(s.model), s.name, s.step,
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


_BY_EXPECTATION = {"group-lr": _group_lr, "state": _state, "cleared": _cleared,
                   "sign": _sign}

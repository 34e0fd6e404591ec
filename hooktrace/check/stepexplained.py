"""The step, explained: optimizer steps that broke an expectation of a training step, one
finding each, saying which expectation and where: a param group's learning rate, the
optimizer's state, the same gradients stepped again (the facts of ``optimizer-steps``),
gradients cleared within one accumulation, a gradient's sign, the move itself
(``step-sample``). The thresholds live here: two steps at least, and for the move half of the
recorded steps judged or more. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding, FindingKind, names_text, steps_text
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

REBUILT_AFTER = 2  # steps an optimizer took before a new one took over: built anew in the loop
COSINE = -0.5  # a move this far against the expected one is reversed
SCALED = 100.0  # a move this many times the expected one is scaled
LISTED = 20


def optimizer_steps(c: Collected, s: Signal) -> list[Finding]:
    """An optimizer's facts: a param group left at lr 0 while another moved, in two steps or
    more; the state lost to an optimizer built anew in the loop (said at the model's last
    optimizer that took over); the same gradients applied again."""
    out = [_finding(c, s.model, int(z["steps"][0]), "group-lr", {
        "optimizer": s.detail.get("optimizer"), "group": z["group"], "steps": z["steps"],
        "count": z["count"], "others": z["others"], "modules": z["modules"]})
        for z in s.detail.get("zero_lr", []) if not z.get("moved") and int(z["count"]) >= 2]
    if "took_over" in s.detail:
        out += _rebuilt(c, s)
    return out + stepped_twice(c, s)


def _rebuilt(c: Collected, s: Signal) -> list[Finding]:
    mine = [o for o in c.signals if o.kind == SignalKind.OPTIMIZER_STEPS and o.model == s.model]
    taken = [o for o in mine if (t := o.detail.get("took_over")) and t.get("state")
             and 0 < int(t.get("steps", 0)) <= REBUILT_AFTER]
    if len(taken) < 2 or taken[-1] is not s or any(
            o.detail.get("resumed") for o in c.signals if o.kind == SignalKind.OPTIMIZER_STEPS):
        return []  # optimizers in turns over the same parameters: not built anew
    steps = [int(o.detail["took_over"]["step"]) for o in taken]
    return [_finding(c, s.model, steps[0], "state", {
        "optimizer": s.detail.get("optimizer"), "steps": steps[:LISTED], "count": len(steps)})]


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


def step_sample(c: Collected, s: Signal) -> list[Finding]:
    """The sampled parameters' facts: gradients cleared twice or more before one step, the
    sign flipped in two steps or more, moves that contradict the optimizer's kind."""
    d, out = s.detail, []
    modules = list(d.get("modules", []))
    cleared = [row for row in d.get("cleared", []) if int(row[0]) >= 2]
    if cleared:
        passes, _, first = min(cleared, key=lambda row: int(row[2]))
        out.append(_finding(c, s.model, int(first), "cleared", {
            "windows": sum(int(row[1]) for row in cleared), "passes": passes,
            "modules": modules}))
    flips = d.get("flips")
    if flips and int(flips["count"]) >= 2:
        out.append(_finding(c, s.model, int(flips["steps"][0]), "sign", {
            "steps": flips["steps"], "count": flips["count"], "factor": flips["factor"],
            "modules": modules}))
    for moves in d.get("moves", []):
        out += _moves(c, s.model, moves)
    return out


def _moves(c: Collected, model: int, moves: dict[str, Any]) -> list[Finding]:
    """The verdicts on an optimizer class's moves that held in two recorded steps or more and
    in half of those judged."""
    steps = moves.get("steps", [])
    broken: dict[tuple[str, str], list[list[Any]]] = {}
    for row in steps:
        key = _verdict(*row[1:])
        if key is not None:
            broken.setdefault(key, []).append(row)
    out = []
    for (verdict, cause), rows in broken.items():
        if len(rows) < 2 or 2 * len(rows) < len(steps):
            continue
        _, cosine, ratio, lr, _, _ = rows[0]
        out.append(_finding(c, model, int(rows[0][0]), "update", {
            "optimizer": moves.get("optimizer"), "verdict": verdict, "cause": cause,
            "steps": [int(row[0]) for row in rows[:LISTED]], "count": len(rows),
            "judged": len(steps), "lr": lr, "cosine": cosine, "ratio": ratio,
            "modules": moves.get("modules", [])}))
    return out


def _verdict(cosine: float, ratio: float, lr: float, moved: bool,
             ascent: str) -> tuple[str, str] | None:
    """What a judged step's move says against its kind's: (verdict, cause), or None."""
    if ascent == "custom":
        return ("reversed", "custom") if cosine < COSINE else None
    if not moved:
        return "still", ""
    if cosine < COSINE:
        return "reversed", ""
    if ratio >= SCALED:
        return "scaled", ""
    return ("reversed", ascent) if ascent and cosine > -COSINE else None


def _finding(c: Collected, model: int, step: int, expectation: str,
             detail: dict[str, Any]) -> Finding:
    modules = [str(m) for m in detail.get("modules", [])]
    steps = [int(x) for x in detail.get("steps", [])]
    message, hint = _BY_EXPECTATION[expectation](
        c.model_name(model), detail, names_text(modules), steps)
    return Finding(FindingKind.STEP_UNEXPLAINED, WARNING, c.model_name(model),
                   modules[0] if modules else "", step, message,
                   {"expectation": expectation, **detail}, hint)


def _group_lr(model: str, d: dict[str, Any], names: str, steps: list[int]) -> tuple[str, str]:
    count, others = int(d.get("count", 0)), float(d.get("others", 0.0))
    return (
        f"param group {d.get('group', '?')} of the {d.get('optimizer', '?')} optimizer of model "
        f"'{model}' ({names}) stepped at lr 0 in all "
        f"{plural(count, 'step')} it had gradients in, while another group of it stepped at "
        f"lr {others:.3g}: its parameters get gradients and never move",
        "a learning rate set on one param group only: set it on each of them (param_group"
        "['lr'] = lr inside the `for param_group in optimizer.param_groups` loop, or the "
        "scheduler's); to keep those parameters fixed, call requires_grad_(False) on them "
        "instead")


def _state(model: str, d: dict[str, Any], names: str, steps: list[int]) -> tuple[str, str]:
    return (
        f"a new {d.get('optimizer', '?')} optimizer took over the parameters of model '{model}' "
        f"{plural(int(d.get('count', len(steps))), 'time')} ({steps_text(steps)}), each "
        "time from one that had stepped once or twice: the optimizer is built anew in the "
        "loop, so its state (moments, step count, momentum) starts empty at every step",
        "build the optimizer once, before the training loop, and reuse it (a scheduler, too, "
        "must hold that one)")


def _cleared(model: str, d: dict[str, Any], names: str, steps: list[int]) -> tuple[str, str]:
    passes, windows = int(d.get("passes", 0)), int(d.get("windows", 1))
    return (
        f"the gradients of model '{model}' ({names}) were cleared between "
        f"backward passes of one accumulation: {passes} passes before one optimizer step "
        f"began from no gradient ({plural(windows, 'accumulation')} so), so the step applies "
        "only the last micro-batch's gradient",
        "call optimizer.zero_grad() once per accumulation, after optimizer.step(), not inside "
        "the micro-batch loop")


def _sign(model: str, d: dict[str, Any], names: str, steps: list[int]) -> tuple[str, str]:
    return (
        f"the gradients of model '{model}' ({names}) were multiplied by a "
        f"negative factor ({float(d.get('factor', -1.0)):.3g}) between backward() and "
        f"optimizer.step() in {plural(int(d.get('count', len(steps))), 'step')} "
        f"({steps_text(steps)}): the step moves the weights along +g, up the loss",
        "clip_grad_norm_(params, max_norm) scales the gradients by max_norm / norm: a "
        "negative max_norm flips their sign; give it a positive max_norm")


def _update(model: str, d: dict[str, Any], names: str, steps: list[int]) -> tuple[str, str]:
    cls, verdict, cause = d.get("optimizer", "?"), d.get("verdict"), d.get("cause")
    count, judged = int(d.get("count", len(steps))), int(d.get("judged", len(steps)))
    where = f"the {cls} optimizer of model '{model}' ({names})"
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

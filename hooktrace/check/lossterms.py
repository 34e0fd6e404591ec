"""Every loss term counts: a term added into the loss that reaches no trainable parameter
(``loss-term-cut``: what cut it, and where), a bootstrapped target that carries a gradient
(``loss-target-grad``), and how much of its batch a classification loss
reads (``loss-share``: a note where targets are ignored, a warning where it read none in every
recorded step). Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import fqn_text

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

# reason -> how the term lost its gradient, and the hint
_CUTS = {
    "detach": ("{op} at {where} detached it from the graph",
               "drop the .detach() where the term should train the model (keep it only on a "
               "target or a teacher's output); a forward hook that stores output.detach() "
               "gives features without gradient"),
    "no_grad": ("it was computed under torch.no_grad() ({op} at {where} ran with gradients "
                "off on weights that need them)",
                "compute the term outside torch.no_grad(); keep no_grad only for what is a "
                "fixed target (a frozen network's features of the real input)"),
    "numpy": ("it went through numpy ({op} at {where}) and came back as a new tensor: "
              "autograd cannot follow numpy",
              "write the term with torch operations on the tensor itself (torch.diff, "
              "torch.abs, .mean()) so that autograd can follow it"),
    "item": ("it was turned into a Python number ({op} at {where}) and added back as a "
             "constant",
             "add the tensor itself to the loss, not loss.item() or float(loss)"),
    "op": ("{op} at {where} has no gradient (a comparison, an argmax, an integer result)",
           "use a differentiable stand-in for the term (a softmax for an argmax, a sigmoid "
           "for a threshold)"),
}


def check_loss_terms(c: Collected) -> list[Finding]:
    """How much of its batch each loss reads (``loss-share``), one finding a loss."""
    shares: dict[tuple[int, str, int], list[Signal]] = {}
    for s in c.signals:
        if s.kind == SignalKind.LOSS_SHARE:
            d = s.detail
            key = (s.model, f"{d.get('by')} {d.get('node')} {d.get('loss')} {d.get('file')}",
                   int(d.get("line", 0)))
            shares.setdefault(key, []).append(s)
    return [_share(c, signals) for signals in shares.values()]


def absorb(c: Collected, findings: list[Finding]) -> list[Finding]:
    """A ``no-grad`` finding whose starved modules all made (or are inside the modules that
    made) a term a ``loss-term-cut`` names: the gradient stops in the loss, outside every
    forward, not inside the boundary's forward. The cut names them; the ``no-grad`` goes."""
    findings = _zeroed(findings)
    cuts = [f for f in findings if f.cause == FindingKind.LOSS_TERM_CUT]
    if not cuts:
        return findings
    kept = []
    grown: dict[int, Finding] = {}  # each cut (by its place) as the no-grads it takes make it
    for f in findings:
        cut = next((i for i, k in enumerate(cuts) if _explains(c, k, f)), None) \
            if f.cause == FindingKind.NO_GRAD else None
        if cut is None:
            kept.append(f)
            continue
        now = grown.get(cut, cuts[cut])
        had = now.evidence.get("starved", [])
        names = [*had, *[s for s in f.evidence.get("starved", []) if s not in had]]
        grown[cut] = replace(now, evidence={**now.evidence, "starved": names},
                             message=f"{now.message}; it starves {', '.join(names)}, which "
                             f"{'gets' if len(names) == 1 else 'get'} no gradient")
    made = {id(cuts[i]): f for i, f in grown.items()}
    return [made.get(id(f), f) for f in kept]


def _zeroed(findings: list[Finding]) -> list[Finding]:
    """A ``zero-gradient`` finding of a model whose loss reads nothing in those steps: the
    loss gave no gradient; the empty read names it, the zero goes."""
    empty = {f.model: f for f in findings if f.cause == "loss-reads-nothing"}
    grown: dict[str, Finding] = {}  # each model's empty read as the zeros it takes make it
    kept = []
    for f in findings:
        nothing = empty.get(f.model) if f.cause == FindingKind.ZERO_GRADIENT else None
        if nothing is None or not set(f.evidence.get("steps", [])) <= set(
                nothing.evidence.get("steps", [])):
            kept.append(f)
            continue
        names = [fqn_text(str(m)) for m in
                 f.evidence.get("modules") or f.evidence.get("starved") or [f.module]]
        now = grown.get(f.model, nothing)
        grown[f.model] = replace(
            now, evidence={**now.evidence, "zeroed": names},
            message=f"{now.message}; the gradient of {', '.join(names[:6])}"
            f"{' and more' if len(names) > 6 else ''} is exactly zero")
    return [grown[f.model] if f is empty.get(f.model) and f.model in grown else f
            for f in kept]


def _explains(c: Collected, cut: Finding, f: Finding) -> bool:
    starved = f.evidence.get("starved") or []
    names = [str(name) for model, name in cut.evidence.get("calls", [])
             if name and c.model_name(model) == f.model]
    return bool(starved) and cut.model == f.model and all(
        any(s == n or s.startswith(n + ".") for n in names) for s in starved)


def _where(file: Any, line: Any) -> str:
    return f"{file}:{line}"


def term_cut(c: Collected, s: Signal) -> list[Finding]:
    d = s.detail
    how, hint = _CUTS.get(str(d.get("reason")), _CUTS["op"])
    where = _where(d.get("file"), d.get("line"))
    code = f" (`{d['code']}`)" if d.get("code") else ""
    models = ", ".join(f"'{c.model_name(m)}'" for m in d.get("models", [s.model]))
    return [Finding(
        FindingKind.LOSS_TERM_CUT, WARNING, c.model_name(s.model), s.fqn, s.step,
        f"a term added into the loss at {_where(d.get('added_file'), d.get('added_line'))} "
        f"reaches no trainable parameter: {how.format(op=d.get('op'), where=where)}{code}. It "
        f"is in the loss, outside every forward: it changes the loss's value, but only the "
        f"other terms train model {models}", dict(d), hint)]


def target_grad(c: Collected, s: Signal) -> list[Finding]:
    d = s.detail
    model = c.model_name(s.model)
    code = f" (`{d['code']}`)" if d.get("code") else ""
    return [Finding(
        FindingKind.LOSS_TARGET_GRAD, WARNING, model, s.fqn, s.step,
        f"the target of {d.get('loss')} at {_where(d.get('file'), d.get('line'))}{code} "
        f"carries a gradient into model '{model}': it is computed from another call of the "
        f"model the prediction comes from, through a {str(d.get('through', 'max')).lower()} "
        "over its output (a bootstrapped target, r + gamma * max Q(s')), so the loss also moves "
        "its own target. It is in the loss, outside every forward", dict(d),
        "compute the target under torch.no_grad() or .detach() it (or take it from a target "
        "network): only the prediction should get the gradient")]


#: the op that keeps part of a loss's elements, as the program wrote it
_MASKS = {"Mul": "loss * mask", "Index": "loss[mask]", "MaskedSelect": "masked_select",
          "Where": "torch.where(mask, loss, ...)"}


def _fact(signals: list[Signal], keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    d = signals[0].detail
    return {**(d if keys is None else {k: d.get(k) for k in keys}),
            "read": [s.detail.get("read") for s in signals],
            "of": [s.detail.get("of") for s in signals], "steps": [s.step for s in signals]}


def _share(c: Collected, signals: list[Signal]) -> Finding:
    """Targets left to ``ignore_index`` or a 0/1 mask over a per-element loss: how much of its
    batch the loss reads (a note), none in every recorded step (a warning)."""
    first = signals[0]
    d = first.detail
    by = d.get("by", "ignore_index")
    if by == "index":
        return _index(c, signals)
    least = min(signals, key=lambda s: s.detail.get("read", 0) / max(s.detail.get("of", 1), 1))
    read, of = least.detail.get("read", 0), least.detail.get("of", 0)
    recorded = c.backward_steps or {s.step for s in signals}
    none = all(s.detail.get("read") == 0 for s in signals) and len(signals) >= len(recorded)
    if by == "mask":
        how = _MASKS.get(str(d.get("node")), "a mask")
        fact = _fact(signals)
        nothing = (f"the loss reads none of its {of} elements in every recorded step: a 0/1 mask "
                   f"({how}) keeps none of them, so the loss is 0 (NaN where divided by "
                   "mask.sum()) and gives the model no gradient",
                   "check the comparison that builds the mask (ids != pad, lengths > position) "
                   "and its dtype and shape against the loss's")
        part = (f"the loss reads {read} of its {of} elements ({100 * read // max(of, 1)}%) at "
                f"step {least.step}: a 0/1 mask ({how}) keeps them")
    else:
        where = f"at {_where(d.get('file'), d.get('line'))}" if d.get("file") else \
            "inside the model's call (a loss it computes, model(..., labels=...).loss)"
        fact = _fact(signals, ("loss", "ignore_index", "file", "line"))
        nothing = (f"{d.get('loss')} {where} ignores every target of the batch in every "
                   f"recorded step (all {of} equal ignore_index={d.get('ignore_index')}): the "
                   "loss is NaN or 0 and gives the model no gradient",
                   "check the labels and the ignore_index: padding or a wrong label mapping "
                   "may have turned every target into the ignored value")
        part = (f"{d.get('loss')} {where} reads part of its batch: {read} of {of} targets at "
                f"step {least.step} (the others equal ignore_index={d.get('ignore_index')})")
    model = c.model_name(first.model)
    if none:
        return Finding("loss-reads-nothing", WARNING, model, first.fqn, first.step, nothing[0],
                       fact, nothing[1])
    return Finding(FindingKind.LOSS_SHARE, NOTE, model, first.fqn, least.step, part, fact)


def _index(c: Collected, signals: list[Signal]) -> Finding:
    """An integer tensor of 0s and 1s used as an index: a mask of the wrong dtype."""
    first = signals[0]
    d = first.detail
    return Finding(
        "loss-mask-index", WARNING, c.model_name(first.model), first.fqn, first.step,
        f"the loss is indexed along dim {d.get('dim')} with an integer tensor of 0s and 1s "
        f"as long as that dim ({d.get('rows')}): a mask of dtype long or int, not bool, picks "
        f"rows 0 and 1 again and again, not the rows it marks; the loss reads "
        f"{d.get('read')} of its {d.get('of')} elements at step {first.step}", _fact(signals),
        "index with a bool mask (loss[mask.bool()]), or multiply: (loss * mask).sum() / "
        "mask.sum()")

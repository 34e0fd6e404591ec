"""Gradient magnitudes: parameter-gradient norms past the vanishing/exploding thresholds, and
activation-gradient norms that grow or fall across the network. Pure: findings from a
``Collected``.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass, replace
from itertools import repeat
from typing import TYPE_CHECKING

from hooktrace.check.findings import (
    NOTE,
    WARNING,
    Finding,
    FindingKind,
    Thresholds,
    names_text,
    steps_text,
)
from hooktrace.log.names import ancestors
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


def _profile_finding(c: Collected, t: Thresholds, explained: Set[ModelFqn]) -> Finding | None:
    """Activation-gradient norms (grad_output) that grow or fall across the network, judged
    within each model (a generator's gradients against its discriminator's say nothing of
    either's depth); not where they fall to a module starved at a boundary ``flow`` names."""
    for step in sorted(c.profiles):
        modules, norms = c.profiles[step]  # backward order: output first
        for model in dict.fromkeys(key[0] for key in modules):
            at = [i for i, key in enumerate(modules) if key[0] == model]
            found = _profile(c, t, explained, step, tuple(modules[i] for i in at),
                             tuple(norms[i] for i in at))
            if found is not None:
                return found
    return None


def _profile(c: Collected, t: Thresholds, explained: Set[ModelFqn], step: int,
             modules: tuple[ModelFqn, ...], norms: tuple[float, ...]) -> Finding | None:
    if len(norms) < 3 or (norms[-1] < norms[0] and modules[-1] in explained):
        return None
    # growth is measured from the largest gradient on the output side (the first quarter
    # in backward order): a model with several heads (a detector's box, mask and proposal
    # heads, an auxiliary loss weighted 1e-8) has one gradient per head there, each as
    # large as its loss, and the smallest says nothing of the way back
    bottom = norms[-1]
    at = max(range(max(1, len(norms) // 4)), key=lambda i: norms[i]) \
        if bottom > norms[0] else 0
    top = norms[at]
    if top <= 0 or bottom <= 0:
        return None
    orders = math.log10(bottom / top)
    if abs(orders) < t.orders:
        return None
    model, name = modules[-1]
    return Finding(
        "exploding" if orders > 0 else "vanishing", WARNING, c.model_name(model), name,
        step,
        f"gradient norms {'grow' if orders > 0 else 'fall'} by {abs(orders):.1f} orders of "
        f"magnitude from {fqn_text(modules[at][1])} ({top:.3g}) back to {name} "
        f"({bottom:.3g}) at step {step}",
        {"profile": [{"module": n, "grad_output_norm": v}
                     for (_, n), v in zip(modules, norms, strict=True)]},
        "deep stacks without normalisation or residual connections, a too large/small "
        "initialisation, or residual blocks that scale their sum down (returning "
        "(x + f(x)) * 0.5 halves the gradient in every block)")


@dataclass
class _BeyondThreshold:
    """A module's parameter-gradient norms past a threshold: the steps, the norm at the first."""

    steps: list[int]
    norm: float
    of: int = 0  # steps with a finite norm for it, past the threshold or not
    last: int = -1  # the last of those steps
    broke: bool = False  # a NaN/Inf norm for it after the last

    @property
    def lasting(self) -> bool:
        """Past it in most of the steps, or in the last two or more, or in the last before its
        norm turned NaN/Inf: not a passing moment (a zero-initialised head at the first step,
        stochastic depth dropping a whole block in one)."""
        return 2 * len(self.steps) > self.of or (
            self.steps[-1] == self.last and (len(self.steps) >= 2 or self.broke))


def _past_thresholds(c: Collected, t: Thresholds, starts: dict[ModelFqn, int]
                     ) -> dict[str, dict[ModelFqn, _BeyondThreshold]]:
    """Per kind, the modules whose parameter-gradient norm passed a threshold in some step:
    ``exploding``, ``vanishing``, ``zero`` (exactly: never excused), and ``bypassed``: below the
    vanishing threshold while a module that runs before it in forward (nearer the input) got a
    larger gradient in that step: the gradient is small in its branch (ConvNeXt's layer scale,
    a gate), not lost on its way."""
    flagged: dict[str, dict[ModelFqn, _BeyondThreshold]] = {
        "vanishing": {}, "exploding": {}, FindingKind.ZERO_GRADIENT: {}, "bypassed": {}}
    zero_loss = c.zero_loss_steps()
    for step in sorted(c.param_norms.keys() - zero_loss):
        norms = _step_norms(c, step)
        earliest: dict[int, int] | None = None  # per model: the first module above vanishing
        for key, norm in norms.items():
            if norm is None:
                continue
            # NaN compares False: a NaN/Inf norm is another check's
            kind = (FindingKind.ZERO_GRADIENT if norm == 0 else "vanishing"
                    if norm < t.vanishing else "exploding" if t.exploding < norm < math.inf
                    else "")
            if not kind:
                continue
            if kind == "vanishing":
                if earliest is None:
                    earliest = _earliest_above(starts, norms, t.vanishing)
                if start(starts, key) > earliest.get(key[0], math.inf):
                    kind = "bypassed"
            past = flagged[kind].get(key)
            if past is None:
                flagged[kind][key] = _BeyondThreshold([step], norm)
            else:
                past.steps.append(step)
    seen = dict.fromkeys((key for modules in flagged.values() for key in modules), 0)
    last = dict.fromkeys(seen, -1)
    broke = dict.fromkeys(seen, -1)  # the last step with a NaN/Inf norm
    if seen:  # the steps with a finite norm for each of them: a second pass, rarely made
        for step in c.param_norms:
            for key, norm in _step_norms(c, step).items():
                if key in seen and norm is not None:
                    if math.isfinite(norm):
                        seen[key] += 1
                        last[key] = max(last[key], step)
                    else:
                        broke[key] = max(broke[key], step)
        for kind, modules in flagged.items():
            for key, past in modules.items():
                past.of, past.last = seen[key], last[key]
                # growing until it overflowed; a small norm before NaN says nothing
                past.broke = kind == "exploding" and broke[key] > last[key]
    return flagged


def _step_norms(c: Collected, step: int) -> dict[ModelFqn, float | None]:
    norms: dict[ModelFqn, float | None] = {}  # a later record of a module overrides
    for model, names, values in c.param_norms[step]:
        norms.update(zip(zip(repeat(model), names), values, strict=True))
    return norms


def _earliest_above(starts: dict[ModelFqn, int], norms: dict[ModelFqn, float | None],
                    limit: float) -> dict[int, int]:
    """Per model, where its first module with a norm of at least ``limit`` starts."""
    earliest: dict[int, int] = {}
    for key, norm in norms.items():
        if norm is not None and limit <= norm < math.inf:
            begins = start(starts, key)
            if begins < earliest.get(key[0], math.inf):
                earliest[key[0]] = begins
    return earliest


def check_magnitudes(c: Collected, t: Thresholds, starts: dict[ModelFqn, int],
                     explained: Set[ModelFqn] = frozenset()) -> list[Finding]:
    """Parameter-gradient norms past the thresholds, and the profile across the network: one
    finding per kind (vanishing, exploding), a warning where they last; a note where they
    passed in a few steps only, or where the gradient got past them to the input side."""
    flagged = _past_thresholds(c, t, starts)
    for modules in flagged.values():  # starved modules whose boundary ``flow`` names
        for key in explained & modules.keys():
            del modules[key]
    bypassed = flagged.pop("bypassed")
    profile = _profile_finding(c, t, explained)
    out: list[Finding] = []
    grown = growth(c)
    for kind, past in flagged.items():
        finding = profile if profile is not None and profile.cause == kind else None
        # past the threshold where the largest norm ended after growing over the steps: the
        # training diverges, even when that is the last step recorded
        lasting = {k: p for k, p in past.items() if p.lasting or (
            kind == "exploding" and grown is not None and grown[2] in p.steps)}
        if kind == FindingKind.ZERO_GRADIENT and lasting:
            out.append(_zero_finding(c, starts, lasting))
        elif lasting or finding is not None:
            made = _magnitude_finding(c, t, starts, kind, lasting, finding)
            if kind == "exploding" and any(p.broke for p in lasting.values()):
                made = replace(made, hint=DIVERGES, message=made.message
                               + ", up to the step before its gradients turned NaN/Inf")
            if kind == "exploding" and grown is not None:
                made = replace(made, hint=DIVERGES,
                               message=f"{made.message}; over the steps, {growth_text(grown)}")
            out.append(made)
        passing = {k: p for k, p in past.items() if k not in lasting}
        if passing:
            out.append(_magnitude_finding(c, t, starts, kind, passing, None, note="passing"))
    if bypassed:
        out.append(_magnitude_finding(c, t, starts, "vanishing", bypassed, None,
                                      note="bypassed"))
    return out


def _zero_finding(c: Collected, starts: dict[ModelFqn, int],
                  modules: dict[ModelFqn, _BeyondThreshold]) -> Finding:
    order = sorted(modules, key=lambda k: start(starts, k))
    first = order[0]
    steps = sorted({s for p in modules.values() for s in p.steps})
    message = (f"{plural(len(order), 'module')} whose parameters' gradient is exactly zero "
               f"({names_text([k[1] for k in order])}, {steps_text(steps)}): no update can "
               "change them")
    hint = ("an Embedding whose every index is its padding_idx, parameters multiplied by 0 or "
            "fully masked in forward, or a custom autograd.Function returning zeros for them")
    if _underflowed(c, {k[0] for k in order}, set(steps)):
        message += ("; the gradient reaching the float16 output of model "
                    f"'{c.model_name(first[0])}' is already exactly zero, and no loss scaler "
                    "scales the loss: its gradients fall below float16's smallest value (6e-8) "
                    "and round to 0")
        hint = ("keep the weights in float32 and train with torch.autocast(dtype=torch.float16) "
                "and torch.amp.GradScaler, which multiplies the loss by 65536 before backward "
                "(or scale the loss up yourself and the gradients down before the step)")
    return Finding(FindingKind.ZERO_GRADIENT, WARNING, c.model_name(first[0]), first[1], steps[0],
                   message, {"modules": [k[1] for k in order], "steps": steps[:20]}, hint)


def _underflowed(c: Collected, models: set[int], steps: set[int]) -> bool:
    """The models' outputs are float16 and their gradient exactly zero in every judged step
    among ``steps``, and no loss scaler ran: float16 underflow (bfloat16 has float32's range)."""
    if any(s.kind == SignalKind.LOSS_SCALE for s in c.signals):
        return False
    roots = [call for call in c.calls
             if call.key[1] == "" and call.key[0] in models and call.step in steps]
    return bool(roots) and all(call.half and call.backed and call.g_out == 0 for call in roots)


def largest_norms(c: Collected, before: float = math.inf) -> dict[int, float]:
    """Per step before ``before``, the largest finite parameter-gradient norm."""
    return {s: max((v for _, _, norms in records for v in norms
                    if v is not None and math.isfinite(v)), default=0.0)
            for s, records in sorted(c.param_norms.items()) if s < before}


def growth(c: Collected, before: float = math.inf, factor: float = 1e3
           ) -> tuple[int, float, int, float] | None:
    """Training that diverges: the largest finite parameter-gradient norm of the steps before
    ``before`` grew by ``factor`` (3 orders of magnitude) or more from the first of them to the
    last (first step, its norm, last step, its norm); None when it did not."""
    largest = largest_norms(c, before)
    if len(largest) < 2:
        return None
    first, last = min(largest), max(largest)
    if largest[first] > 0 and largest[last] >= factor * largest[first]:
        return first, largest[first], last, largest[last]
    return None


def growth_text(grown: tuple[int, float, int, float]) -> str:
    first, low, last, high = grown
    return (f"the largest parameter-gradient norm grew from {low:.2g} (step {first}) to "
            f"{high:.2g} (step {last})")


DIVERGES = ("the training diverges: each update makes the next gradient larger. Lower the "
            "learning rate, clip gradients (torch.nn.utils.clip_grad_norm_), or warm the "
            "learning rate up")


def start_orders(c: Collected) -> dict[ModelFqn, int]:
    """Where each module starts in forward order: the first return (forward seq) in its subtree,
    since a forward event is written when its call returns (a parent after its children)."""
    start: dict[ModelFqn, int] = {}
    for (model, name), m in c.modules.items():
        if m.first_seq is not None:
            for fqn in [name, *ancestors(name)]:
                if m.first_seq < start.get((model, fqn), math.inf):
                    start[(model, fqn)] = m.first_seq
    return start


def start(starts: dict[ModelFqn, int], key: ModelFqn) -> int:
    """A module never called (its parent uses its parameters) starts with its parent."""
    model, name = key
    for fqn in [name, *reversed(ancestors(name))]:
        found = starts.get((model, fqn))
        if found is not None:
            return found
    return 0


_NOTES = {  # why a vanishing/exploding module is a note: (what the message adds, the hint)
    "passing": (
        "in a few of the steps only ({steps}); the other steps are within the threshold",
        "usual at the first step after a zero-initialised layer (a ViT head), or where "
        "stochastic depth drops a whole block; look again if it comes back"),
    "bypassed": (
        "while modules that run before them got larger gradients ({steps}): the gradient is "
        "small inside their branch, not lost on its way to the input",
        "usual for layer scale (ConvNeXt initialises it at 1e-6) and gated branches; look again "
        "if it stays that small as training goes on"),
}


def _magnitude_finding(c: Collected, t: Thresholds, starts: dict[ModelFqn, int], kind: str,
                       modules: dict[ModelFqn, _BeyondThreshold], finding: Finding | None,
                       note: str = ""
                       ) -> Finding:
    """One finding for ``modules``: ``finding`` (the profile's) with them added, a warning of
    their own, or a note (``note``: a key of _NOTES)."""
    if not modules:
        assert finding is not None
        return finding
    order = sorted(modules, key=lambda k: start(starts, k))
    limit = t.vanishing if kind == "vanishing" else t.exploding
    listed = ", ".join(f"{fqn_text(k[1])} {modules[k].norm:.2g}" for k in order[:6])
    past = ("of exactly 0" if kind == FindingKind.ZERO_GRADIENT else
            f"{'below' if kind == 'vanishing' else 'above'} {limit:g}")
    about = (f"{plural(len(order), 'module')} with a parameter-gradient norm {past}: {listed}"
             + (f" and {len(order) - 6} more" if len(order) > 6 else ""))
    norms = {k[1]: modules[k].norm for k in order}
    first = order[0]
    if note:
        steps = sorted({s for p in modules.values() for s in p.steps})
        adds, hint = _NOTES[note]
        return Finding(kind, NOTE, c.model_name(first[0]), first[1], steps[0],
                       f"{about}, {adds.format(steps=steps_text(steps))}",
                       {"grad_norm": norms, "steps": steps}, hint)
    if finding is None:
        finding = Finding(kind, WARNING, c.model_name(first[0]), first[1],
                          modules[first].steps[0], about, {},
                          "check initialisation, normalisation layers and the "
                          "learning-rate scale")
    else:
        finding = replace(finding, message=f"{finding.message}; {about}")
    finding = replace(finding, evidence={**finding.evidence, "grad_norm": norms})
    return finding

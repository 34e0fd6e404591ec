"""The findings of gradient-flow boundaries (``boundary.Boundary``): for each cause, the finding's
kind, what happens at the boundary and where to look; and whether it passes (a note).

In the texts, ``{branch}`` is the child (or children) whose output starves inside the
boundary's forward; ``{gain}`` what the boundary passes back of what it receives; ``{ratio}`` the
largest ratio of a starved child's gradient to its sibling's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, names_text, steps_text
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.boundary import Boundary, GradientFlow
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn

# a zero that one batch can make (a note when rare); never a detach or no_grad: code does those
RANDOM_ZERO = {"zeroed", "zeroed_unit", "zero_backward", "dead_activation"}
# a drop layer's whole drops are its own chance unless their probability is below this
CHANCE = 1e-6

# what makes a gradient stop at once: integer results, step functions, detaching
_NOT_DIFFERENTIABLE = (
    "integer results (argmax/argmin indices used to index a table, .long(), a comparison such as "
    "(x > 0).float())")
_STEP_FUNCTIONS = (
    "torch.round/floor/sign (a gradient of 0 everywhere: use a straight-through estimator, "
    "x + (q - x).detach())")

# cause -> (finding kind, what happens, hint)
CAUSES = {
    "lost_input": (
        FindingKind.NO_GRAD,
        "its input needed a gradient and none came back: the gradient stops inside its forward",
        "look in its forward for .detach(), .data, a torch.no_grad() block, .item()/.numpy(), "
        "a tensor rebuilt from numbers (torch.tensor(x), torch.from_numpy), "
        f"{_NOT_DIFFERENTIABLE}, or a custom autograd.Function whose backward returns None for "
        "that input"),
    "detached_inside": (
        FindingKind.NO_GRAD,
        "the gradient stops inside its forward: the output of {branch} gets no gradient back",
        "look in its forward, where {branch}'s output is used, for .detach(), .data, "
        ".item()/.numpy() round trips, a tensor rebuilt with torch.tensor(...) or "
        f"torch.from_numpy, {_NOT_DIFFERENTIABLE}, or an output the loss does not use"),
    "let_go": (
        FindingKind.NO_GRAD,
        "its output is returned out of the forward of its caller, and no gradient comes back "
        "to it while the caller's other outputs get one: the code that called the model let "
        "it go",
        "the loss term made from it became a number (.item(), float(), .detach()) or was left "
        "out of the sum, or the loss reads another of the model's outputs (out[1] for out[0]): "
        "add the tensor itself into the loss"),
    "unused_calls": (
        FindingKind.NO_GRAD,
        "the output of {branch} gets no gradient back while another call of the same module "
        "does: inside its forward, those calls' results are overwritten, detached or never used",
        "a loop that throws its results away: a recurrent state re-initialised inside the time "
        "loop (h = zeros(...) in the loop, not before it) lets only the last step reach the "
        "loss, and the state's own layer multiplies zeros; else a result detached (.detach(), "
        "torch.no_grad()) where a later call or the output reads it (a siamese branch), or "
        "computed and not used"),
    "no_grad": (
        FindingKind.NO_GRAD_UNDER_NO_GRAD,
        "inside its forward, torch.no_grad() covers {branch}: no "
        "gradient can reach {branch}",
        "move {branch} out of the torch.no_grad() block, or freeze what should not train with "
        ".requires_grad_(False)"),
    "zeroed": (
        FindingKind.ZERO_GRADIENT,
        "the gradient of {branch}'s output is exactly zero: inside its "
        "forward, {branch}'s output is multiplied by 0 or fully masked",
        f"look for a loss weight or gate of 0, a mask that removes every element, or "
        f"{_STEP_FUNCTIONS}"),
    "selected": (
        FindingKind.ZERO_GRADIENT,
        "the gradient of {branch}'s output is exactly zero, and only part of "
        "the output of {reads} is read: a selection by the data (the anchors matched to boxes, "
        "a mask, a max-pool) that leaves {branch} out",
        "usual where which part is read depends on the data (a detector's feature levels or "
        "anchors with no matching box); if it never changes over varied batches, check the "
        "matching (anchor sizes against the boxes) or the mask; a branch multiplied by 0 "
        "inside this forward looks the same"),
    "zeroed_unit": (
        FindingKind.ZERO_GRADIENT,
        "the gradient of {branch}'s output is exactly zero: its last dim has "
        "size 1, and inside its forward a softmax or normalisation over that dim makes it a "
        "constant (a softmax over one element is 1 whatever it is), or it is multiplied by 0 "
        "or fully masked",
        "check the dim of the softmax or normalisation applied to {branch}'s output: over the "
        "sequence (dim=1 for (batch, seq, 1) scores), not its size-1 last dim; else look for a "
        "loss weight or gate of 0"),
    "flat_inside": (
        "saturated", "the gradient reaching {branch}'s output is at most {ratio} of what a "
        "sibling module in its forward gets: inside its forward, "
        "{branch}'s output goes through something flat",
        "a saturated softmax or sigmoid on {branch}'s output: scores far from 0 (attention "
        "scores multiplied by sqrt(d) instead of divided, inputs not normalised, too low a "
        "temperature), or a multiplication by a vanishing factor"),
    "unit_norm": (
        FindingKind.ZERO_GRADIENT,
        "it normalises over its input's last dim, of size 1: its output is a "
        "constant whatever its input (a LayerNorm's is its bias, a softmax's 1), and it passes "
        "back {gain} of the gradient it receives",
        "normalise over the features, not over a single value: drop the LayerNorm/softmax on a "
        "one-value output, or apply it over the dim you mean"),
    "zero_weights": (
        FindingKind.ZERO_GRADIENT,
        "it passes back an exactly-zero gradient: its weights are zero",
        "a zero-initialised layer passes no gradient back until its first update; if it stays "
        "zero, check that its parameters are in the optimizer and train"),
    "zero_backward": (
        FindingKind.ZERO_GRADIENT,
        "it passes back an exactly-zero gradient for a non-zero one",
        f"a custom autograd.Function whose backward returns zeros, {_STEP_FUNCTIONS}, or a "
        "mask or a multiplication by 0 inside its forward"),
    "dropped": (
        FindingKind.ZERO_GRADIENT,
        "it dropped its whole input (every sample of the batch): it passes "
        "back an exactly-zero gradient",
        "stochastic depth and dropout drop a whole small batch now and then, by chance (not "
        "reported); this many drops are not chance: its drop probability is 1 (a keep "
        "probability passed as p?) or far too high"),
    "dead_activation": (
        "dead-activation", "every element of its input is in the flat part (a ReLU whose "
        "input is all negative): it passes back an exactly-zero gradient",
        "look at the layer before it: a large negative bias, a too large learning rate, or "
        "inputs not normalised; LeakyReLU or a normalisation layer keep it alive"),
    "saturated": (
        "saturated", "it is saturated: it passes back {gain} of the gradient it receives",
        "its inputs are far from 0: look at the layer before it for too large weights or a bias "
        "initialised far from 0 (a gate closed at -40); normalise its inputs (BatchNorm/LayerNorm) "
        "or lower the learning rate"),
    "small_gain": (
        "vanishing", "it passes back only {gain} of the gradient it receives",
        "check its weights' scale and initialisation"),
}


def findings(flow: GradientFlow, c: Collected) -> list[Finding]:
    return [f for b in flow.boundaries.values()
            if (f := _finding(flow, b, c)) is not None]


def _finding(flow: GradientFlow, b: Boundary, c: Collected) -> Finding | None:
    model, name = b.key
    chance = flow.by_chance(b)
    if chance is not None and chance >= CHANCE:
        return None  # a drop layer's own probability makes this many whole drops
    m = c.modules.get(b.key)
    cause = "flat_inside" if b.ratio is not None and b.cause == "zeroed" else b.cause
    kind, what, hint = CAUSES[cause]
    branch = names_text(list(b.branches), 3) if b.branches else "a child"
    victims = sorted(b.victims, key=lambda k: c.first_seq(*k))
    gain = f"{b.g_in / b.g_out:.1e}" if b.g_in is not None and b.g_out else "?"
    ratio = (f"{b.ratio:.1e}" if b.ratio is not None else "?") + (
        " (zero at some steps)" if b.exact else "")
    # the calls whose outputs the loss reads in part, with the share of exactly-zero gradient
    reads = names_text([f"{name} ({share:.1%} of its gradient exactly zero)"
                        for name, share in b.reads.items()], 2)
    message = (f"{fqn_text(name)} ({m.cls if m else '?'}): "
               f"{what.format(branch=branch, gain=gain, ratio=ratio, reads=reads)}; "
               f"{_victims(b, victims, c)} at {steps_text(b.steps)}")
    judged = flow.judged.get(model, [])
    later = len(judged) - len(b.steps)
    first = b.steps == judged[:len(b.steps)] and (
        later > 0 or (b.cause == "zero_weights" and len(judged) == 1))
    # a zero that one batch can make, in a quarter of the steps or fewer, or a drop layer's
    # (stochastic depth, dropout) in some steps only; never a detach or no_grad: code does those
    now_and_then = not first and (
        (b.cause in RANDOM_ZERO and 4 * len(b.steps) <= len(judged))
        or (b.cause == "dropped" and chance is None and b.steps != judged))
    # a loss reading part of an output: the evidence cannot tell the data's selection from a
    # branch zeroed inside the forward as well
    passing = first or now_and_then or b.cause == "selected"
    if chance == 0:
        message += " (its drop probability is 1: it drops every input)"
    elif chance is not None:
        message += (f" ({plural(len(b.drops), 'whole drop')} in {flow.draws[b.key][0]} "
                    f"calls: a chance of at most {chance:.0e} at its drop probability)")
    if passing and b.cause != "selected":  # (without later steps: only the first is in the log)
        message += (f", not in the other {plural(later, 'step')} judged" if now_and_then else
                    f", not in the {plural(later, 'later step')}" if later else
                    ": usual at the first step after a zero-initialised layer (a ViT head)")
    evidence: dict[str, Any] = {"starved": [k[1] for k in victims], "steps": b.steps[:20]}
    for key, norm in (("grad_output_norm", b.g_out), ("grad_input_norm", b.g_in)):
        if norm is not None:
            evidence[key] = norm
    return Finding(kind, NOTE if passing else WARNING, c.model_name(model),
                   name, b.steps[0], message, evidence, hint.format(branch=branch))


def _victims(b: Boundary, victims: list[ModelFqn], c: Collected) -> str:
    """The modules it starves; for calls whose results are thrown away, the modules that learn
    from their other calls only."""
    names = names_text([k[1] for k in victims])
    if b.cause == "unused_calls":
        return f"{plural(len(victims), 'trainable module')} ({names}) learn from other calls only"
    # a gate's value runs after the gate's sigmoid, and starves all the same
    before = " before it" if all(c.first_seq(*k) < c.first_seq(*b.key)
                                 for k in victims) else ""
    return f"it starves {plural(len(victims), 'trainable module')}{before} ({names})"

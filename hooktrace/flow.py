"""Where the gradient dies: the boundary module of each gradient lost or zeroed, per call.

Along each recorded step, a module call is *starved* when it has trainable parameters and its
backward got no gradient, or an exactly-zero one (*dead*), or one orders of magnitude below what
a later module received (*weak*). The finding names the **boundary**, the module where the
gradient is lost, with the starved calls as its evidence:

* a call that receives a usable gradient and passes back exactly zero (zero weights, a dead
  ReLU, a custom ``autograd.Function`` returning zeros) or at most ``Thresholds.gain`` of it
  (a saturated sigmoid), or whose input needed a gradient and got none (``lost``: a
  ``.detach()``, ``.data`` or numpy round trip inside its forward);
* failing that, the innermost call enclosing the starved one that did get a gradient: the
  gradient stops inside *its* forward (a ``.detach()`` or ``torch.no_grad()`` around a child's
  output, a branch multiplied by 0).

Only calls inside a top-level call that got a gradient are judged: a whole model call without
backward (a validation pass, a teacher) is not a lost gradient. A tiny gradient whose module is
bypassed (a module before it gets a large one: a layer scale on a residual branch) is not
reported; an exactly-zero one always is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from hooktrace.findings import (
    NOTE,
    WARNING,
    Finding,
    Thresholds,
    ancestors,
    names_text,
    plural,
    steps_text,
)

if TYPE_CHECKING:
    from hooktrace.collected import ModuleKey, ModuleStats

STEPS = 32  # recorded steps judged call by call (the first ones): bounded memory on long logs

# element-wise activations: what a zero or tiny gain means for them
_RELU_LIKE = {"ReLU", "ReLU6", "Hardtanh", "Threshold", "RReLU", "CELU", "ELU", "SELU"}
# layers that drop whole inputs at random: an exactly-zero gradient now and then is theirs
_DROPPING = {"StochasticDepth", "DropPath", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
             "AlphaDropout", "FeatureAlphaDropout"}
_SATURATING = {"Sigmoid", "Tanh", "Softmax", "LogSigmoid", "Hardsigmoid", "Softsign",
               "Tanhshrink", "GELU", "SiLU", "Mish", "Hardswish", "Softplus", "LogSoftmax"}


@dataclass(slots=True)
class Call:
    """One forward call of a judged step, and what its backward received and gave."""

    step: int
    seq: int
    key: ModuleKey
    call: int
    grad: bool  # ran with gradient recording on
    backed: bool = False  # its backward ran
    g_out: float | None = None  # norm of the gradients reaching its outputs (None: unknown)
    g_in: float | None = None  # norm of the gradients of its inputs (None: none flowed)
    lost: bool = False  # an input that needed a gradient got none
    finite: bool = True

    def gradients(self, outs: Sequence[Sequence[float] | None] | None,
                  ins: Sequence[Sequence[float] | None] | None) -> None:
        """Its backward's statistics (``[norm, absmax, ...]`` per tensor) into norms. A call
        that was fed keeps that: its backward runs again, with other numbers, when a later pass
        goes back through its gradient's graph (a gradient penalty, ``create_graph=True``,
        where a ReLU's second derivative is exactly zero)."""
        if self.fed:
            return
        self.backed = True
        self.g_out, out_ok = _norm(outs)
        self.g_in, in_ok = _norm(ins)
        self.finite = out_ok and in_ok

    @property
    def fed(self) -> bool:
        """It received a usable gradient: finite, not zero (or of unknown size: no stats)."""
        return self.backed and self.finite and (self.g_out is None or self.g_out > 0)

    @property
    def dead(self) -> bool:
        return not self.backed or (self.finite and self.g_out == 0)


def _norm(stats: Sequence[Sequence[float] | None] | None) -> tuple[float | None, bool]:
    if stats is None:
        return None, True
    norms = [s[0] for s in stats if s is not None]
    if not norms:
        return None, True
    total = math.sqrt(sum(n * n for n in norms))
    return total, math.isfinite(total)


@dataclass
class Boundary:
    """One module where gradient is lost, over the judged steps."""

    key: ModuleKey
    kind: str
    cause: str  # a key of _CAUSES
    steps: list[int] = field(default_factory=list)
    victims: dict[ModuleKey, None] = field(default_factory=dict)
    # for a cause inside a forward: its children whose outputs starve
    branches: dict[str, None] = field(default_factory=dict)
    g_out: float | None = None  # at the first step
    g_in: float | None = None


@dataclass
class Flow:
    """The boundaries found, and the modules they explain (no other finding needs them)."""

    boundaries: dict[tuple[ModuleKey, str], Boundary] = field(default_factory=dict)
    judged: dict[int, list[int]] = field(default_factory=dict)  # per model, its judged steps

    @property
    def victims(self) -> set[ModuleKey]:
        return {v for b in self.boundaries.values() for v in b.victims}


def analyse(calls: Iterable[Call], modules: dict[ModuleKey, ModuleStats],
            t: Thresholds) -> Flow:
    flow = Flow()
    groups: dict[tuple[int, int], list[Call]] = {}
    for c in calls:
        groups.setdefault((c.step, c.key[0]), []).append(c)
    for (step, model), group in sorted(groups.items()):
        if any(c.backed for c in group):
            flow.judged.setdefault(model, []).append(step)
            group.sort(key=lambda c: c.seq)
            _judge_step(flow, step, group, modules, t)
    return flow


def _trainable(modules: dict[ModuleKey, ModuleStats], key: ModuleKey) -> bool:
    m = modules.get(key)
    return m is not None and m.trainable > 0


def _judge_step(flow: Flow, step: int, calls: list[Call],
                modules: dict[ModuleKey, ModuleStats], t: Thresholds) -> None:
    enclosing = _Enclosing(calls)
    candidates = _candidates(calls, t)
    bypassed: dict[int, bool] = {}  # per candidate's seq
    # a shared module's parameters train through its fed calls: an exactly-zero gradient on
    # another call is a loss that reads part of its outputs (a detection head on the feature
    # levels without a matching anchor); a call that got no gradient at all is still lost
    fed = {c.key for c in calls if c.fed}
    for v in calls:
        if not _trainable(modules, v.key) or not v.finite:
            continue
        top = enclosing.outermost(v)
        if top is None or not top.fed:
            continue  # a whole call without backward: not a gradient lost inside a model
        if v.dead and v.backed and v.key in fed:
            continue
        if v.dead:
            b = _nearest_after(v, candidates, lambda b: b.lost or b.g_in == 0)
            if b is not None:
                _add(flow, step, b, _cause(b, modules), v)
            else:
                _add_inside(flow, step, enclosing, v)
        elif v.g_out is not None:
            b = (_nearest_after(v, candidates, partial(_starves, v=v))
                 or _gated_by(v, candidates, enclosing, modules, t))
            if b is None:
                continue
            if b.seq not in bypassed:
                bypassed[b.seq] = (not _saturated(b, modules, t)
                                   and _bypassed(b, calls, modules))
            if not bypassed[b.seq]:
                _add(flow, step, b, _cause(b, modules), v)


def _candidates(calls: list[Call], t: Thresholds) -> list[Call]:
    """The calls that may be a boundary, in forward order: fed, with a lost input or a gain of
    at most ``t.gain``; not those fed only what an earlier boundary (on the way back) let
    through: in a chain of small gains, the first one is the cause."""
    found: list[Call] = []
    for c in reversed(calls):  # backward order, roughly
        if c.fed and (c.lost or ((gain := _gain(c)) is not None and gain <= t.gain)) and not any(
                b.g_in is not None and c.g_out is not None and _starves(b, c) for b in found):
            found.append(c)
    return found[::-1]


def _gain(c: Call) -> float | None:
    if c.g_out is None or c.g_in is None or not c.g_out:
        return None
    return c.g_in / c.g_out


def _starves(b: Call, v: Call) -> bool:
    """``v``'s gradient is as small as what ``b`` passes back, far below what ``b`` receives
    (unknown sizes, a lost input's among them, say nothing)."""
    if b.g_out is None or b.g_in is None or v.g_out is None:
        return False
    return v.g_out <= 1e3 * b.g_in and v.g_out < 1e-3 * b.g_out


def _bypassed(b: Call, calls: list[Call], modules: dict[ModuleKey, ModuleStats]) -> bool:
    """A module before ``b`` got a gradient that ``b``'s small gain cannot explain: it came
    round ``b`` (a residual shortcut), and what ``b`` starves is its own branch."""
    return any(c.seq < b.seq and c.fed and c.g_out is not None and _trainable(modules, c.key)
               and not _starves(b, c) for c in calls)


def _saturated(b: Call, modules: dict[ModuleKey, ModuleStats], t: Thresholds) -> bool:
    """A saturating activation whose gain is far below a layer scale's: it starves its branch
    whatever goes round it (a gate whose bias closes it)."""
    m = modules.get(b.key)
    gain = _gain(b)
    return m is not None and m.cls in _SATURATING and gain is not None and gain <= t.saturated


def _gated_by(v: Call, candidates: list[Call], enclosing: _Enclosing,
              modules: dict[ModuleKey, ModuleStats], t: Thresholds) -> Call | None:
    """A saturated activation in the same forward as ``v`` whose output multiplies ``v``'s (a
    gate ``sigmoid(gate(x)) * value(x)``): ``v``'s gradient is as small as what it passes back,
    though ``v`` may run after it."""
    around = enclosing.chain(v)[:1]
    for b in candidates:
        if (around and _saturated(b, modules, t) and _starves(b, v)
                and not _contains(b.key, v.key) and enclosing.chain(b)[:1] == around):
            return b
    return None


def _nearest_after(v: Call, candidates: list[Call], ok: Callable[[Call], bool]) -> Call | None:
    """The first candidate to run after ``v`` in forward, outside ``v``'s own subtree and not
    one of its ancestors: on the gradient's way back, the last module before ``v``."""
    for b in candidates:
        if b.seq > v.seq and not _contains(b.key, v.key) and ok(b):
            return b
    return None


def _contains(outer: ModuleKey, inner: ModuleKey) -> bool:
    return outer[0] == inner[0] and (outer[1] == "" or inner[1] == outer[1]
                                     or inner[1].startswith(outer[1] + "."))


class _Enclosing:
    """The calls enclosing a call: for each ancestor module (by fqn), its first call to return
    after the call returned (a parent returns after its children)."""

    def __init__(self, calls: list[Call]) -> None:
        self._by_key: dict[ModuleKey, list[Call]] = {}
        for c in calls:
            self._by_key.setdefault(c.key, []).append(c)

    def chain(self, v: Call) -> list[Call]:
        """Innermost first."""
        out = []
        model = v.key[0]
        for name in reversed(ancestors(v.key[1])):
            call = next((c for c in self._by_key.get((model, name), ()) if c.seq > v.seq), None)
            if call is not None:
                out.append(call)
        return out

    def outermost(self, v: Call) -> Call | None:
        chain = self.chain(v)
        return chain[-1] if chain else None


def _add_inside(flow: Flow, step: int, enclosing: _Enclosing, v: Call) -> None:
    """``v`` starves with no module to blame on its way back: the gradient stops inside the
    forward of the innermost call around it that got one."""
    branch = v
    for outer in enclosing.chain(v):
        if outer.fed:
            cause = "zeroed" if v.backed else "detached_inside" if v.grad else "no_grad"
            label = branch.key[1] + (f" (call {branch.call})" if branch.call else "")
            _add(flow, step, outer, cause, v).branches[label] = None
            return
        branch = outer


def _cause(b: Call, modules: dict[ModuleKey, ModuleStats]) -> str:
    m = modules.get(b.key)
    cls = m.cls if m else "?"
    if b.lost:
        return "lost_input"
    if b.g_in == 0:
        if cls in _RELU_LIKE:
            return "dead_activation"
        if cls in _SATURATING:
            return "saturated"
        if cls in _DROPPING:
            return "dropped"
        return "zero_weights" if m is not None and m.params else "zero_backward"
    return "saturated" if cls in _SATURATING or cls in _RELU_LIKE else "small_gain"


def _add(flow: Flow, step: int, b: Call, cause: str, victim: Call) -> Boundary:
    kind = _CAUSES[cause][0]
    found = flow.boundaries.get((b.key, cause))
    if found is None:
        found = flow.boundaries[(b.key, cause)] = Boundary(b.key, kind, cause, g_out=b.g_out,
                                                           g_in=b.g_in)
    if not found.steps or found.steps[-1] != step:
        found.steps.append(step)
    found.victims[victim.key] = None
    return found


_RANDOM_ZERO = {"zeroed", "zero_backward", "dead_activation"}

# cause -> (finding kind, what happens, hint)
_CAUSES = {
    "lost_input": (
        "no-grad", "its input needed a gradient and none came back: the gradient stops inside "
        "its forward",
        "look in its forward for .detach(), .data, a torch.no_grad() block, .item()/.numpy(), "
        "a tensor rebuilt from numbers (torch.tensor(x), torch.from_numpy), or a custom "
        "autograd.Function whose backward returns None for that input"),
    "detached_inside": (
        "no-grad", "the gradient stops inside its forward: the output of {branch} gets no "
        "gradient back",
        "look in its forward, where {branch}'s output is used, for .detach(), .data, "
        ".item()/.numpy() round trips, a tensor rebuilt with torch.tensor(...) or "
        "torch.from_numpy, or an output the loss does not use"),
    "no_grad": (
        "no-grad-under-no_grad", "inside its forward, torch.no_grad() covers {branch}: no "
        "gradient can reach {branch}",
        "move {branch} out of the torch.no_grad() block, or freeze what should not train with "
        ".requires_grad_(False)"),
    "zeroed": (
        "zero-gradient", "the gradient of {branch}'s output is exactly zero: inside its "
        "forward, {branch}'s output is multiplied by 0 or fully masked",
        "look for a loss weight or gate of 0, or a mask that removes every element"),
    "zero_weights": (
        "zero-gradient", "it passes back an exactly-zero gradient: its weights are zero",
        "a zero-initialised layer passes no gradient back until its first update; if it stays "
        "zero, check that its parameters are in the optimizer and train"),
    "zero_backward": (
        "zero-gradient", "it passes back an exactly-zero gradient for a non-zero one",
        "a custom autograd.Function whose backward returns zeros, or a mask or a "
        "multiplication by 0 inside its forward"),
    "dropped": (
        "zero-gradient", "it dropped its whole input (every sample of the batch): it passes "
        "back an exactly-zero gradient",
        "stochastic depth and dropout drop a whole small batch now and then (a note); in every "
        "step, its drop probability is 1"),
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


def findings(flow: Flow, modules: dict[ModuleKey, ModuleStats],
             model_name: dict[int, str]) -> list[Finding]:
    return [_finding(flow, b, modules, model_name) for b in flow.boundaries.values()]


def _finding(flow: Flow, b: Boundary, modules: dict[ModuleKey, ModuleStats],
             model_name: dict[int, str]) -> Finding:
    model, name = b.key
    m = modules.get(b.key)
    _, what, hint = _CAUSES[b.cause]
    branch = names_text(list(b.branches), 3) if b.branches else "a child"
    gain = f"{b.g_in / b.g_out:.1e}" if b.g_in is not None and b.g_out else "?"
    victims = sorted(b.victims, key=lambda k: _first_seq(modules, k))
    # a gate's value runs after the gate's sigmoid, and starves all the same
    before = " before it" if all(_first_seq(modules, k) < _first_seq(modules, b.key)
                                 for k in victims) else ""
    message = (f"{name or '(root)'} ({m.cls if m else '?'}): "
               f"{what.format(branch=branch, gain=gain)}; it starves "
               f"{plural(len(victims), 'trainable module')}{before} "
               f"({names_text([k[1] for k in victims])}) at {steps_text(b.steps)}")
    judged = flow.judged.get(model, [])
    later = len(judged) - len(b.steps)
    first = b.steps == judged[:len(b.steps)] and (
        later > 0 or (b.cause == "zero_weights" and len(judged) == 1))
    # a zero that one batch can make, in a quarter of the steps or fewer, or a drop layer's
    # (stochastic depth, dropout) in some steps only; never a detach or no_grad: code does those
    now_and_then = not first and (
        (b.cause in _RANDOM_ZERO and 4 * len(b.steps) <= len(judged))
        or (b.cause == "dropped" and b.steps != judged))  # a drop layer: a bug in every step
    passing = first or now_and_then
    if now_and_then:
        message += f", not in the other {plural(later, 'step')} judged"
    elif passing and later:
        message += f", not in the {plural(later, 'later step')}"
    elif passing:  # only the first step is in the log
        message += ": usual at the first step after a zero-initialised layer (a ViT head)"
    evidence: dict[str, Any] = {"starved": [k[1] for k in victims], "steps": b.steps[:20]}
    if b.g_out is not None:
        evidence["grad_output_norm"] = b.g_out
    if b.g_in is not None:
        evidence["grad_input_norm"] = b.g_in
    return Finding(b.kind, NOTE if passing else WARNING, model_name.get(model, str(model)),
                   name, b.steps[0], message, evidence, hint.format(branch=branch))


def _first_seq(modules: dict[ModuleKey, ModuleStats], key: ModuleKey) -> int:
    m = modules.get(key)
    return (m.first_seq or 0) if m is not None else 0

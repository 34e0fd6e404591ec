"""Where the gradient dies: the boundary module of each gradient lost or zeroed, per call.

Along each recorded step, a module call is *starved* when it has trainable parameters and its
backward got no gradient, or an exactly-zero one (*dead*), or one orders of magnitude below what
a later module received (*weak*). The finding names the **boundary**, the module where the
gradient is lost, with the starved calls as its evidence: a call that receives a usable gradient
and passes back exactly zero or at most ``Thresholds.gain`` of it, or whose input needed a
gradient and got none (``lost``); a normalisation over a last dim of size 1; failing that, the
innermost call enclosing the starved one that did get a gradient (``_add_inside``,
``_add_flat_inside``). What each cause says is ``causes.py``'s.

Only calls inside a top-level call that got a gradient are judged: a whole model call without
backward (a validation pass, a teacher) is not a lost gradient; nor is an evaluation pass
between optimizer steps (``_evaluation``). A tiny gradient whose module is bypassed (a layer
scale on a residual branch) is not reported; an exactly-zero one always is.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from hooktrace.check.boundary import Boundary, GradientFlow
from hooktrace.check.calls import (
    Enclosing,
    FirstAtLeast,
    JudgedCall,
    only_looked_at,
    passes_nothing,
    passes_zero,
    reach,
    returned_unread,
    starves,
)
from hooktrace.check.findings import Thresholds
from hooktrace.check.grouped import inside

if TYPE_CHECKING:
    from hooktrace.check.collected import ModuleStats
    from hooktrace.check.keys import ModelFqn

STEPS = 32  # recorded steps judged call by call (the first ones): bounded memory on long logs

# element-wise activations: what a zero or tiny gain means for them
_RELU_LIKE = {"ReLU", "ReLU6", "Hardtanh", "Threshold", "RReLU", "CELU", "ELU", "SELU"}
# layers that drop whole inputs at random: an exactly-zero gradient now and then is theirs
_DROPPING = {"StochasticDepth", "DropPath", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
             "AlphaDropout", "FeatureAlphaDropout"}
_SATURATING = {"Sigmoid", "Tanh", "Softmax", "LogSigmoid", "Hardsigmoid", "Softsign",
               "Tanhshrink", "GELU", "SiLU", "Mish", "Hardswish", "Softplus", "LogSoftmax"}
# what an exactly-zero gain says, by class (else zero weights, or a backward that returns zeros)
_ZERO_GAIN = {**dict.fromkeys(_RELU_LIKE, "dead_activation"),
              **dict.fromkeys(_SATURATING, "saturated"), **dict.fromkeys(_DROPPING, "dropped")}
# layers that normalise over the last dim: over a dim of size 1 their output is a constant, and
# the gain they pass back is rounding noise (1e-5 for a LayerNorm), not an exact zero
_NORMALISING_LAST = {"LayerNorm", "RMSNorm", "Softmax", "Softmin", "LogSoftmax"}
_UNIT_NORM_GAIN = 1e-3
# a child's gradient at most this fraction of a sibling's in the same forward, nothing on its
# way back to blame: something flat inside that forward. Below any layer scale in use (1e-6 is
# ConvNeXt's, the smallest); a layer scale's branch has no sibling fed a full gradient
_FLAT_INSIDE = 1e-7
# a loss that reads only part of a call's outputs (a selection by the data: a detector's
# matched anchors, a mask) leaves at least this share of their gradient exactly zero; a loss
# over all of them (cross-entropy, an MSE), none of it
_READ_PART = 0.5


def analyse(calls: Iterable[JudgedCall], modules: dict[ModelFqn, ModuleStats],
            t: Thresholds) -> GradientFlow:
    flow = GradientFlow()
    groups: dict[tuple[int, int], list[JudgedCall]] = {}
    for c in calls:
        groups.setdefault((c.step, c.key[0]), []).append(c)
        if c.chance is not None and c.fed:
            n, q = flow.draws.get(c.key, (0, 0.0))
            flow.draws[c.key] = (n + 1, max(q, c.chance))
    for (step, model), group in sorted(groups.items()):
        if any(c.backed for c in group):
            flow.judged.setdefault(model, []).append(step)
            group.sort(key=lambda c: c.seq)
            _judge_step(flow, step, group, modules, t)
    return flow


def _trainable(modules: dict[ModelFqn, ModuleStats], key: ModelFqn) -> bool:
    """``key`` has trainable parameters: its own, or, for a second path to a module under another
    parent (BYOL's ``online_encoder.net``), its first name's."""
    m = modules.get(key)
    if m is not None and m.alias_of is not None:
        m = modules.get((key[0], m.alias_of))
    return m is not None and m.trainable > 0


def _judge_step(flow: GradientFlow, step: int, calls: list[JudgedCall],
                modules: dict[ModelFqn, ModuleStats], t: Thresholds) -> None:
    enclosing = Enclosing(calls, partial(_trainable, modules))
    sparse = [c for c in calls if c.fed and c.zeros is not None and c.zeros >= _READ_PART]
    candidates = _Candidates(_candidates(calls, modules, t), enclosing, modules, t)
    bypassed: dict[int, bool] = {}  # per candidate's seq
    for v in calls:
        if not _trainable(modules, v.key) or not v.finite:
            continue
        top = enclosing.outermost(v)
        if top is None or not top.fed:
            continue  # a whole call without backward: not a gradient lost inside a model
        if _evaluation(enclosing, v):
            continue  # an evaluation pass between optimizer steps: not training
        if v.dead and v.backed and enclosing.fed_elsewhere(v):
            continue  # a shared module trains through its fed calls: a zero one is a loss
            # reading part of its outputs (a detection head's level without a matching anchor)
        if v.dead:
            b = candidates.zero_after(v)
            if b is not None:
                _add(flow, step, b, _cause(b, modules), v)
            else:
                _add_inside(flow, step, enclosing, v, sparse)
        elif v.g_out is not None:
            b = candidates.starving_after(v) or candidates.gated_by(v)
            if b is None:
                _add_flat_inside(flow, step, enclosing, v)
                continue
            if b.seq not in bypassed:
                bypassed[b.seq] = (not _saturated(b, modules, t)
                                   and _bypassed(b, enclosing))
            if not bypassed[b.seq]:
                _add(flow, step, b, _cause(b, modules), v)


def _evaluation(enclosing: Enclosing, v: JudgedCall) -> bool:
    """``v`` ran in an evaluation pass (its outermost call around it that is one, or itself:
    under no_grad, or in eval mode with no backward) of a module that another call of the step
    trained: a validation pass between optimizer steps (timm validates the model inside its
    wrapper when an epoch ends), whose calls the log nests in the training call of the step
    after it. Not a call in eval mode with no backward inside a
    forward that ran in eval mode and trained (a model trained in eval mode on purpose, its
    frozen BatchNorms): there it is a result the loss does not use, as in train mode."""
    if not _passive(v):
        return False
    top, caller = v, None
    for outer in enclosing.chain(v):  # innermost first
        if not _passive(outer):
            caller = outer
            break
        top = outer
    if top.grad and caller is not None and caller.eval_mode:
        return False
    return enclosing.fed_elsewhere(v) or enclosing.fed_elsewhere(top)


def _passive(c: JudgedCall) -> bool:
    """``c`` trained nothing: it ran under no_grad, or in eval mode and no backward reached it."""
    return not c.grad or (c.eval_mode and not c.backed)


def _candidates(calls: list[JudgedCall], modules: dict[ModelFqn, ModuleStats],
                t: Thresholds) -> list[JudgedCall]:
    """The calls that may be a boundary, in forward order: fed, with a lost input or a gain of
    at most ``t.gain`` (``_UNIT_NORM_GAIN`` for a normalisation over a dim of size 1); not those
    fed only what an earlier boundary (on the way back) let through: in a chain of small gains,
    the first one is the cause."""
    found: list[JudgedCall] = []
    farthest = -math.inf  # the largest reach of those found: what starves c is c.g_out below it
    for c in reversed(calls):  # backward order, roughly
        gain = _gain(c)
        limit = _UNIT_NORM_GAIN if _unit_norm(c, modules) else t.gain
        if _cancelled(c, modules, t):
            continue
        if c.fed and (c.lost or (gain is not None and gain <= limit)) and (
                c.g_out is None or c.g_out > farthest or (c.g_out == farthest and not any(
                    b.g_in is not None and starves(b, c) for b in found))):
            found.append(c)
            farthest = max(farthest, reach(c))
    return found[::-1]


def _cancelled(c: JudgedCall, modules: dict[ModelFqn, ModuleStats], t: Thresholds) -> bool:
    """A saturating activation that receives an exploding gradient and passes back a usable
    one: the loss after it divides by its own derivative (``Sigmoid`` then ``BCELoss``, whose
    gradient is ``(p - y) / (p (1 - p))``), so its small gain starves nothing; what comes back
    is the logits' gradient ``BCEWithLogitsLoss`` would give."""
    m = modules.get(c.key)
    return (m is not None and m.cls in _SATURATING and c.g_out is not None
            and c.g_in is not None and c.g_out >= t.exploding and c.g_in >= t.vanishing)


def _unit_norm(c: JudgedCall, modules: dict[ModelFqn, ModuleStats]) -> bool:
    m = modules.get(c.key)
    return c.unit_last and m is not None and m.cls in _NORMALISING_LAST


def _gain(c: JudgedCall) -> float | None:
    if c.g_out is None or c.g_in is None or not c.g_out:
        return None
    return c.g_in / c.g_out


def _bypassed(b: JudgedCall, enclosing: Enclosing) -> bool:
    """A module before ``b`` got a gradient ``b``'s small gain cannot explain: a shortcut round
    ``b``."""
    top = enclosing.largest_before(b)
    return top is not None and not starves(b, replace(b, g_out=top))


def _saturated(b: JudgedCall, modules: dict[ModelFqn, ModuleStats], t: Thresholds) -> bool:
    """A saturating activation far below a layer scale's gain: it starves its branch whatever goes
    round it."""
    m = modules.get(b.key)
    gain = _gain(b)
    return m is not None and m.cls in _SATURATING and gain is not None and gain <= t.saturated


class _Candidates:
    """A step's candidates in forward order, with max trees that find the first that may answer a
    call."""

    def __init__(self, found: list[JudgedCall], enclosing: Enclosing,
                 modules: dict[ModelFqn, ModuleStats], t: Thresholds) -> None:
        self._found, self._seqs = found, [b.seq for b in found]
        self._enclosing, self._modules, self._t = enclosing, modules, t
        self._zero = FirstAtLeast([1.0 if passes_nothing(b) else -math.inf for b in found])
        self._starving = FirstAtLeast([reach(b) for b in found])
        self._gates: dict[int, tuple[list[JudgedCall], FirstAtLeast]] | None = None

    def zero_after(self, v: JudgedCall) -> JudgedCall | None:
        """The nearest one after ``v`` (``_after``) that passes back nothing."""
        return self._after(v, self._found, self._zero, bisect_right(self._seqs, v.seq), 1.0,
                           passes_nothing)

    def starving_after(self, v: JudgedCall) -> JudgedCall | None:
        """The nearest one after ``v`` (``_after``) that starves it."""
        if v.g_out is None:
            return None
        return self._after(v, self._found, self._starving, bisect_right(self._seqs, v.seq),
                           v.g_out, lambda b: starves(b, v))

    @staticmethod
    def _after(v: JudgedCall, found: list[JudgedCall], tree: FirstAtLeast, i: int, x: float,
               ok: Callable[[JudgedCall], bool]) -> JudgedCall | None:
        """The first of ``found`` from ``i`` on, outside ``v``'s own subtree and not one of its
        ancestors, that is ``ok`` (its number in ``tree`` at least ``x``, as ``ok`` needs). Asked
        from the first to run after ``v`` in forward: on the gradient's way back, the last module
        before ``v``."""
        while (at := tree.find(i, x)) is not None:
            b = found[at]
            if not inside(v.key, [b.key]) and ok(b):
                return b
            i = at + 1
        return None

    def gated_by(self, v: JudgedCall) -> JudgedCall | None:
        """A saturated activation in the same forward as ``v`` whose output multiplies ``v``'s
        (a gate ``sigmoid(gate(x)) * value(x)``): ``v``'s gradient is as small as what it
        passes back, though ``v`` may run after it."""
        if self._gates is None:  # the saturated ones, by the innermost call around them
            by_around: dict[int, list[JudgedCall]] = {}
            for b in self._found:
                chain = self._enclosing.chain(b)
                if chain and _saturated(b, self._modules, self._t):
                    by_around.setdefault(chain[0].seq, []).append(b)
            self._gates = {seq: (bs, FirstAtLeast([reach(b) for b in bs]))
                           for seq, bs in by_around.items()}
        around = self._enclosing.chain(v)[:1] if self._gates else None
        gates = self._gates.get(around[0].seq) if around else None
        if gates is None or v.g_out is None:
            return None
        return self._after(v, *gates, 0, v.g_out, lambda b: starves(b, v))


def _add_inside(flow: GradientFlow, step: int, enclosing: Enclosing, v: JudgedCall,
                sparse: list[JudgedCall]) -> None:
    """``v`` starves with no module to blame on its way back: the gradient stops inside the
    forward of the innermost call around it that got one; or, where that call returns the
    child's output as one of its own whose gradient is exactly zero, after it returned: in the
    forward of the next one out. Where the loss reads only part of that call's outputs, or of
    a call inside its forward (``sparse``: at least ``_READ_PART`` of their gradient exactly
    zero), the zero may be that selection's (``selected``)."""
    branch = v
    fed = [outer for outer in enclosing.chain(v) if outer.fed]
    for outer in enclosing.chain(v):
        if outer.fed:
            if v.backed and outer is not fed[-1] and passes_zero(outer, branch):
                branch = outer  # the zero arises where outer's output is read
                continue
            cause = ("zeroed_unit" if branch.unit_last else "zeroed") if v.backed else \
                ("unused_calls" if enclosing.fed_elsewhere(v) else "detached_inside") \
                if v.grad else "no_grad"
            if cause == "unused_calls" and (only_looked_at(outer, branch)
                                            or returned_unread(outer, branch)):
                return
            if cause == "detached_inside" and returned_unread(outer, branch):
                outer, cause = branch, "let_go"  # it stops after outer returned: the caller's
            reads = _reading_part(enclosing, outer, sparse) if v.backed else {}
            b = _add(flow, step, outer, "selected" if reads else cause, v)
            b.branches[_label(branch)] = None
            for name, share in reads.items():
                b.reads[name] = max(share, b.reads.get(name, 0.0))
            b.exact = True
            return
        branch = outer


def _reading_part(enclosing: Enclosing, outer: JudgedCall, sparse: list[JudgedCall]
                  ) -> dict[str, float]:
    """``outer`` or the outermost calls inside it whose outputs the loss reads in part, with their
    zero share."""
    if outer in sparse:
        return {_label(outer): outer.zeros or 0.0}
    inside = [c for c in sparse if outer in enclosing.chain(c)]
    return {_label(c): c.zeros or 0.0 for c in inside
            if not any(d in inside for d in enclosing.chain(c))}


def _label(c: JudgedCall) -> str:
    return c.key[1] + (f" (call {c.call})" if c.call else "")


def _add_flat_inside(flow: GradientFlow, step: int, enclosing: Enclosing, v: JudgedCall) -> None:
    """``v``'s gradient is tiny with no module to blame on its way back: a boundary (as a zeroed
    one, with its ratio) where it is at most ``_FLAT_INSIDE`` of a sibling's, a call with
    parameters inside the forward of the innermost call around ``v`` that got a gradient, and
    the gradients there fall in two groups far apart (attention's q and k behind a saturated
    softmax, its v fed in full); not a gradual fall, as through a deep stack (``vanishing``)."""
    if not v.g_out or v.g_out > _FLAT_INSIDE * enclosing.largest:
        return  # not tiny next to any gradient of the step (most calls: no more to ask)
    chain = enclosing.chain(v)
    at = next((i for i, c in enumerate(chain) if c.fed), None)
    if at is None:
        return
    outer, branch = chain[at], chain[at - 1] if at else v
    # the gradients of the calls with parameters inside outer's forward, but for v's lineage
    lineage, best = enclosing.lineage(outer, v)
    if v.g_out > _FLAT_INSIDE * best or enclosing.inside(outer).between(
            1e3 * v.g_out, 1e-3 * best, lineage):
        return
    b = _add(flow, step, outer, "zeroed", v)
    b.branches[_label(branch)] = None
    b.ratio = max(b.ratio or 0.0, v.g_out / best)


def _cause(b: JudgedCall, modules: dict[ModelFqn, ModuleStats]) -> str:
    m = modules.get(b.key)
    cls = m.cls if m else "?"
    if b.lost:
        return "lost_input"
    if _unit_norm(b, modules):
        return "unit_norm"
    if b.g_in == 0:
        return _ZERO_GAIN.get(cls) or ("zero_weights" if m is not None and m.params
                                       else "zero_backward")
    return "saturated" if cls in _SATURATING or cls in _RELU_LIKE else "small_gain"


def _add(flow: GradientFlow, step: int, b: JudgedCall, cause: str, victim: JudgedCall) -> Boundary:
    found = flow.boundaries.get((b.key, cause))
    if found is None:
        found = flow.boundaries[(b.key, cause)] = Boundary(b.key, cause, g_out=b.g_out,
                                                           g_in=b.g_in)
    if not found.steps or found.steps[-1] != step:
        found.steps.append(step)
    if cause == "dropped":
        found.drops[b.seq] = None
    found.victims[victim.key] = None
    return found

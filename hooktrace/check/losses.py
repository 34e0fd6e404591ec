"""A loss given the wrong inputs, or that diverges. Wrong inputs: a target of another shape that
broadcasts (an ``MSELoss`` of ``[16, 1]`` against ``[16]``), probabilities where the loss wants
scores (a model ending in ``Softmax`` fed to ``CrossEntropyLoss``), raw scores into
``nll_loss``: seen from a loss module's call, or for a function (``F.cross_entropy``) from the
ops between it and the model's output (``loss-ops``). Diverging, from the loss ledger
(``loss-values``): orders of magnitude up without NaN/Inf, or down below zero without a floor.
Pure: a ``Collected`` in."""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import WARNING, Finding
from hooktrace.log.schema import VIEW_OPS, SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, LossCall
    from hooktrace.log.schema import Signal

# losses comparing input and target element by element: another shape broadcasts
_ELEMENTWISE = {"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"}
# loss -> the last modules whose output it must not get, and what it wants instead
_WANTS_SCORES = {
    "CrossEntropyLoss": ({"Softmax", "Softmin"}, "applies log_softmax itself",
                         "return the raw scores (logits) from the model: drop the final Softmax, "
                         "or apply it only when predicting"),
    "BCEWithLogitsLoss": ({"Sigmoid"}, "applies the sigmoid itself",
                          "return the raw scores (logits) from the model: drop the final "
                          "Sigmoid, or use nn.BCELoss on probabilities"),
    "NLLLoss": ({"Softmax", "Softmin"}, "wants log-probabilities",
                "end the model with nn.LogSoftmax, or return the scores and use "
                "nn.CrossEntropyLoss"),
}
LOSSES = _ELEMENTWISE | _WANTS_SCORES.keys()
# a loss diverges when it peaks this many times its first value and its second half's median
# stays this many times above it, over this many passes at least
_PEAK, _LATE, _PASSES = 100.0, 3.0, 8
_SQUASHES = "probabilities where it wants scores; the loss can hardly move and the gradient shrinks"


def check_losses(c: Collected) -> list[Finding]:
    out = []
    for (model, name), call in sorted(c.losses.items()):
        cls = c.modules[(model, name)].cls if (model, name) in c.modules else ""
        if cls in _ELEMENTWISE:
            out.extend(_broadcast(c, model, name, cls, call))
        elif cls in _WANTS_SCORES and call.after is not None:
            out.extend(_probabilities(c, cls, call))
    return out + check_loss_ops(c, {f.model for f in out if f.cause == "loss-input"})


def _broadcast(c: Collected, model: int, name: str, cls: str, call: LossCall) -> list[Finding]:
    shapes = [s for s in call.shapes if isinstance(s, list)]
    if len(shapes) != 2 or shapes[0] == shapes[1]:
        return []
    joint = _broadcast_shape(shapes[0], shapes[1])
    if joint is None:
        return []
    a, b = (_text(s) for s in shapes)
    return [Finding(
        "loss-broadcast", WARNING, c.model_name(model), name, call.step,
        f"{c.label(model, name)} compares input {a} with target {b}: they broadcast to "
        f"{_text(joint)}, so each prediction is compared with every target (torch warns "
        "'Using a target size that is different to the input size'): the loss cannot fall as "
        "it should",
        {"input": shapes[0], "target": shapes[1], "broadcast": joint},
        "give both the same shape: pred.squeeze(-1), or target.view_as(pred)")]


def _probabilities(c: Collected, cls: str, call: LossCall) -> list[Finding]:
    assert call.after is not None
    model, last = call.after
    forbidden, does, hint = _WANTS_SCORES[cls]
    last_cls = c.modules[call.after].cls if call.after in c.modules else ""
    if last_cls not in forbidden:
        return []
    return [Finding(
        "loss-input", WARNING, c.model_name(model), last, call.step,
        f"model '{c.model_name(model)}' ends with {c.label(model, last)}, and its output goes "
        f"to {cls}, which {does}: {_SQUASHES}", {"loss": cls, "last": last_cls}, hint)]


def _broadcast_shape(a: list[Any], b: list[Any]) -> list[int] | None:
    out = []
    for x, y in zip(reversed([1] * (len(b) - len(a)) + a), reversed([1] * (len(a) - len(b)) + b),
                    strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return out[::-1]


def _text(shape: list[Any]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


# -- functional losses: the ops from the loss back to the model's output (``loss-ops``) ----------

_NLL = {"NllLoss", "NllLoss2D"}
# ops whose output is raw scores: a layer's product (Linear, Conv), no normalisation after it
_RAW = {"Addmm", "Mm", "Bmm", "Baddbmm", "Linear", "Convolution"}
# the op that made probabilities -> what it is, the loss that wants scores, what it does, and the
# hints where it is outside the model and where the model ends with it
_SQUASHED = {
    "Softmax": ("a softmax", "cross_entropy (F.cross_entropy or nn.CrossEntropyLoss)",
                "applies log_softmax itself",
                "pass the raw scores (logits) to the loss: drop the softmax before it (apply it "
                "only when predicting)",
                "return the raw scores (logits) from the model: drop the final softmax, or "
                "apply it only when predicting"),
    "Sigmoid": ("a sigmoid", "binary_cross_entropy_with_logits (F."
                "binary_cross_entropy_with_logits or nn.BCEWithLogitsLoss)",
                "applies the sigmoid itself",
                "pass the raw scores (logits) to the loss: drop the sigmoid before it, or use "
                "F.binary_cross_entropy on probabilities",
                "return the raw scores (logits) from the model (apply the sigmoid only when "
                "predicting), or keep it and use F.binary_cross_entropy on the probabilities"),
}


def check_loss_ops(c: Collected, module_found: set[str]) -> list[Finding]:
    """Functional losses given the wrong inputs; not for a model named in ``module_found``."""
    out: list[Finding] = []
    said: set[tuple[int, str]] = set()
    for s in c.signals:
        if s.kind != SignalKind.LOSS_OPS or c.model_name(s.model) in module_found:
            continue
        loss, out_op = str(s.detail.get("loss", "")), str(s.detail.get("out", ""))
        ops = [o for o in [*s.detail.get("ops", []), out_op] if o not in VIEW_OPS]
        squashed = "Softmax" if loss in _NLL and ops[:2] == ["LogSoftmax", "Softmax"] else \
            "Sigmoid" if loss == "BinaryCrossEntropyWithLogits" and ops[:1] == ["Sigmoid"] \
            else ""
        if squashed:  # in the model where it made the module's output
            found = _squashed(c, s, squashed, in_model=out_op == squashed)
        elif loss in _NLL and len(ops) == 1 and ops[0] in _RAW:
            found = _raw_scores(c, s)
        else:
            continue
        if (s.model, found.message) not in said:
            said.add((s.model, found.message))
            out.append(found)
    return out


def _output_of(c: Collected, s: Signal) -> str:
    model = c.model_name(s.model)
    return f"model '{model}'" if s.fqn == "" else f"{c.label(s.model, s.fqn)} of model '{model}'"


def _squashed(c: Collected, s: Signal, op: str, in_model: bool) -> Finding:
    what, loss, does, hint, hint_in_model = _SQUASHED[op]
    name = str(s.detail.get("last", s.fqn)) if in_model else s.fqn
    where = (f"{_output_of(c, s)} ends with {what}, in {c.label(s.model, name)}, and its output "
             f"goes" if in_model else f"the output of {_output_of(c, s)} goes through {what}, then")
    return Finding(
        "loss-input", WARNING, c.model_name(s.model), name, s.step,
        f"{where} to {loss}, which {does}: {_SQUASHES}",
        {"loss": s.detail.get("loss"), "ops": s.detail.get("ops"), "out": s.detail.get("out")},
        hint_in_model if in_model else hint)


def _raw_scores(c: Collected, s: Signal) -> Finding:
    last = str(s.detail.get("last", s.fqn))  # the module whose scores it takes: the culprit
    return Finding(
        "loss-input", WARNING, c.model_name(s.model), last, s.step,
        f"nll_loss (F.nll_loss or nn.NLLLoss) takes the output of {_output_of(c, s)} as it is: "
        f"the raw scores of {c.label(s.model, last)}, where it wants log-probabilities; "
        "-score[target] has no lower bound, so the loss goes negative and the scores grow "
        "without end",
        {"loss": s.detail.get("loss"), "ops": s.detail.get("ops"), "out": s.detail.get("out")},
        "apply F.log_softmax(scores, dim=1) before nll_loss, or use F.cross_entropy on the "
        "scores")


def diverged(c: Collected, s: Signal) -> list[Finding]:
    """The loss ledger of a group of models (``loss-values``): a loss that went up by orders of
    magnitude from the untrained model's value without NaN/Inf, and stayed well above it over
    the second half of the run (a loss that rises for a few steps and falls again is not)."""
    values = [v for v in s.detail.get("values") or () if isinstance(v, int | float)]
    steps = s.detail.get("steps") or []
    if len(values) < _PASSES or len(steps) != len(values) or min(values) < 0 or values[0] <= 0:
        return []  # too short to say, a loss that may be negative (a GAN's, an actor's)
    start, peak = values[0], max(values)
    late = sorted(values[len(values) // 2:])[len(values[len(values) // 2:]) // 2]
    if peak < _PEAK * start or late < _LATE * start:
        return []
    at = steps[values.index(peak)]
    return [Finding(
        "loss-diverged", WARNING, c.model_name(s.model), "", at,
        f"the loss of model '{c.model_name(s.model)}' went from {start:.3g} (step {steps[0]}) "
        f"to {peak:.3g} (step {at}), {peak / start:.0f}x up without NaN/Inf, and stayed "
        f"{late / start:.0f}x above its start over the second half of the run: training "
        "diverges", {"start": start, "peak": peak, "late": late, "steps": [steps[0], at]},
        "a learning rate too high for the optimizer (1e-3 is usual for Adam, 0.1 for SGD), a "
        "loss of the wrong sign or scale, or updates that grow: lower the lr, add warm-up or "
        "gradient clipping")]


def unbounded(c: Collected) -> list[Finding]:
    """The loss ledger of a group of models (``loss-values``): a loss below zero over the second
    half of the run, falling in four passes of five at least, and falling no slower in the
    second half than in the first: it has no floor, the optimizer runs down it without end (a
    KL divergence or an NLL fed raw scores where it wants log-probabilities). A loss that may be
    negative and levels off (a Gaussian NLL, a critic's, an actor's) is not."""
    out = []
    for s in c.signals:
        values = s.detail.get("values") or []
        steps, half = s.detail.get("steps") or [], len(values) // 2
        if (s.kind != SignalKind.LOSS_VALUES or len(values) < _PASSES
                or len(steps) != len(values) or None in values or max(values[half:]) >= 0):
            continue
        falls = sum(b < a for a, b in pairwise(values))
        first, second = values[0] - values[half], values[half] - values[-1]
        if falls >= 0.8 * (len(values) - 1) and second >= first > 0:
            name = c.model_name(s.model)
            out.append(Finding(
                "loss-diverged", WARNING, name, "", steps[0],
                f"the loss of model '{name}' fell from {values[0]:.3g} (step {steps[0]}) to "
                f"{values[-1]:.3g} (step {steps[-1]}), below zero and no slower in the second "
                "half of the run than in the first: it has no floor, and training runs down it "
                "without end", {"start": values[0], "end": values[-1],
                                "fall": [round(first, 4), round(second, 4)]},
                "a loss bounded below (a KL divergence, an NLL, a cross-entropy) fed raw scores "
                "where it wants log-probabilities: apply F.log_softmax first"))
    return out

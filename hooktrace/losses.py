"""Loss modules given the wrong inputs: a target of another shape that broadcasts (an
``MSELoss`` of ``[16, 1]`` against ``[16]`` compares every prediction with every target), and
probabilities where the loss wants scores (a model ending in ``Softmax`` fed to
``CrossEntropyLoss``, which applies log_softmax itself). Pure: a ``Collected`` in; seen only
where the loss is a module (``nn.MSELoss()``), not a function (``F.mse_loss``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.findings import WARNING, Finding

if TYPE_CHECKING:
    from hooktrace.collected import Collected, LossCall

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


def check_losses(c: Collected) -> list[Finding]:
    out = []
    for (model, name), call in sorted(c.losses.items()):
        cls = c.modules[(model, name)].cls if (model, name) in c.modules else ""
        if cls in _ELEMENTWISE:
            out.extend(_broadcast(c, model, name, cls, call))
        elif cls in _WANTS_SCORES and call.after is not None:
            out.extend(_probabilities(c, cls, call))
    return out


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
        f"to {cls}, which {does}: probabilities where it wants scores; the loss can hardly move "
        "and the gradient shrinks", {"loss": cls, "last": last_cls}, hint)]


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

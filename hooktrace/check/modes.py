"""Backward in eval mode: a warning where it changes what trains (BatchNorm normalising with
its running statistics, dropout off), silent where it does not (linear probing: a frozen
backbone kept in eval mode on purpose, a trainable head) or where no optimizer steps the model
(Grad-CAM, saliency: a backward that explains the model). Pure: a ``Collected`` in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, names_text
from hooktrace.check.trainable import trainable_at
from hooktrace.log.schema import SignalKind

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal


def eval_backward(c: Collected, s: Signal) -> list[Finding]:
    if not any(o.kind == SignalKind.OPTIMIZER_STEPS and o.model == s.model
               and o.detail.get("after") for o in c.signals):
        return []  # no optimizer step follows: a backward that explains a model (Grad-CAM)
    layers = modal_training(c, s.model, s.step)
    if not layers:
        return []  # what trains acts the same in eval mode (linear probing a frozen backbone)
    # only drop layers, in a model with a frozen part: a head trained on a frozen backbone in
    # eval mode on purpose, its dropout off (a note)
    probing = all(c.modules[(s.model, name)].drop is not None for name in layers) and any(
        m.model == s.model and m.params and not m.trainable for m in c.modules.values())
    what = ("its dropout is off in what trains (a head trained on a frozen backbone in eval "
            "mode: linear probing?)" if probing else "dropout is off, and BatchNorm normalises "
            "with its running statistics and does not update them")
    return [Finding(
        FindingKind.EVAL_BACKWARD, NOTE if probing else WARNING, c.model_name(s.model), s.fqn,
        s.step,
        f"model '{c.model_name(s.model)}' ran backward in eval mode (model.training is False) "
        f"from step {s.step} on: {what} ({names_text(layers, 3)} in what trains)",
        {"layers": layers[:20]},
        "call model.train() again after a validation pass (model.eval()) before training on")]


def modal_training(c: Collected, model: int, step: int) -> list[str]:
    """The layers of ``model`` that act differently in train and eval mode and belong to what
    trains at ``step``: a BatchNorm whose own parameters train (one without parameters, or a
    drop layer of p > 0, whose parent's other modules train). None: eval mode changes nothing
    that trains (linear probing: a frozen backbone in eval mode, a trainable head)."""
    trains = trainable_at(c, model, step)
    out = []
    for (m, name), stats in c.modules.items():
        if m != model or not stats.calls:
            continue
        norm = "BatchNorm" in stats.cls or "InstanceNorm" in stats.cls
        if norm and stats.params:
            if name in trains:
                out.append(name)
        elif norm or (stats.drop is not None and stats.drop[0] > 0):
            parent = name.rpartition(".")[0]
            if any(t != name and (parent == "" or t.startswith(parent + ".")) for t in trains):
                out.append(name)
    return sorted(out, key=lambda name: (c.modules[(model, name)].first_seq or 0))

"""Who may see whom (``run --probe``): the probe's facts as findings. Samples that mix without
a layer that mixes them by design (``samples-mixed``), BatchNorm's batch statistics in a loss
that compares the samples of a batch with each other, masks that let a position see later
(``sees-later``) or padded positions (``sees-padding``); what holds is said in notes.
Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import Signal

#: ops between a loss and a model's output that compare samples with each other (InfoNCE's
#: ``q @ k.t()``)
_SIMILARITY = frozenset({"Mm", "Bmm", "Matmul", "Einsum"})


def check_probed(c: Collected) -> list[Finding]:
    return [_BY_WHAT.get(str(s.detail.get("what")), _unknown)(c, s) for s in c.signals
            if s.kind == SignalKind.PROBE]


def _unknown(c: Collected, s: Signal) -> Finding:
    return _note(c, s, f"the probe could not tell who sees whom in model "
                       f"'{c.model_name(s.model)}': {s.detail.get('why', '?')}")


def _note(c: Collected, s: Signal, message: str, kind: str = FindingKind.PROBE,
          hint: str | None = None) -> Finding:
    """What the probe measured: a note, or with a ``hint`` a warning."""
    return Finding(kind, NOTE if hint is None else WARNING, c.model_name(s.model), s.fqn, s.step,
                   message, dict(s.detail), hint or "a fact the probe measured (run --probe)")


def _listed(numbers: list[int], count: int) -> str:
    shown = ", ".join(map(str, numbers))
    return f"{shown}, ..." if count > len(numbers) else shown


def _compares_samples(c: Collected, model: int) -> bool:
    """The loss reaches the model's output through a matmul (a similarity between the
    samples of a batch, as InfoNCE's ``q @ k.t()``)."""
    return any(s.kind == SignalKind.LOSS_OPS and s.model == model
               and _SIMILARITY & set(s.detail.get("ops", [])) for s in c.signals)


def _batch(c: Collected, s: Signal) -> Finding:
    d: dict[str, Any] = s.detail
    n, axis = d.get("samples", 0), d.get("axis", 0)
    model = c.model_name(s.model)
    if d.get("verdict") == "apart":
        return _note(c, s, f"the probe: in model '{model}' the output for each sample depends "
                           f"on its own sample only (input axis {axis}, {n} samples)")
    count, sample = d.get("count", 0), d.get("sample", 0)
    sees = f"{plural(count, 'other sample')} ({_listed(d.get('sees', []), count)})"
    measured = (f"the output for sample {sample} depends on {sees} of its batch of {n} (input "
                f"axis {axis})")
    mixers = d.get("mixers") or []
    if mixers:
        says = (f"{c.label(s.model, s.fqn)} is a BatchNorm in train mode: it mixes the samples "
                f"of a batch through its statistics ({measured})")
        if not _compares_samples(c, s.model):
            return _note(c, s, f"the probe: {says}", "samples-mixed")
        return _note(
            c, s, f"{says}, and the loss compares the model's outputs of one batch with each "
            f"other (a matmul of outputs, as InfoNCE's q @ k.t()): the batch statistics leak "
            f"between the samples the loss tells apart, so the model can learn the task from "
            f"the leak instead of the data", "samples-mixed",
            "use a norm that keeps samples apart (GroupNorm, LayerNorm), or shuffle the "
            "samples across devices before BatchNorm (MoCo's shuffling BN)")
    if d.get("verdict") == "all":
        return _note(c, s, f"the probe: in model '{model}' {measured}: every sample sees the "
                           f"whole batch (attention or a similarity across samples, on purpose, "
                           f"or an axis mixed by mistake)", "samples-mixed")
    return _note(
        c, s, f"in model '{model}' {measured} and not on the others, and no layer that mixes "
        f"samples by design (BatchNorm) is in it: a view or reshape across the batch axis mixes "
        f"samples (a (T, B, H) tensor reshaped to (B, -1) without moving the batch axis first)",
        "samples-mixed", "move the batch axis to the front (permute or transpose) before a "
        "reshape that folds other axes into it")


def _causal(c: Collected, s: Signal) -> Finding:
    d: dict[str, Any] = s.detail
    who = c.label(s.model, s.fqn)
    masks: dict[str, str] = d.get("masks") or {}
    given = ", ".join(f"its {k} hides {v}" for k, v in masks.items())
    if d.get("is_causal"):
        given = f"{given}, is_causal=True" if given else "is_causal=True"
    if d.get("verdict") != "leaks":
        return _note(c, s, f"the probe: {who} keeps each position from later ones ("
                           f"{given or 'no mask'}; measured)")
    count, t = d.get("count", 0), d.get("position", 0)
    sees = (f"its output at position {t} depends on {plural(count, 'later position')} "
            f"({_listed(d.get('sees', []), count)}) of its input")
    if given:
        message = (f"{who}: {given}, yet {sees}: the mask lets position t see the future; a "
                   f"causal mask hides what is above the diagonal (True, or -inf, at "
                   f"torch.triu(ones, 1))")
        hint = ("attn_mask=torch.triu(torch.ones(T, T, dtype=torch.bool), 1), or "
                "nn.Transformer.generate_square_subsequent_mask(T)")
    else:
        message = (f"{who} is called without a causal mask in a model fed x[:, :-1] (the "
                   f"input of next-step prediction, whose targets are x[:, 1:]): {sees}, the "
                   f"very positions it learns to predict")
        hint = ("pass mask=nn.Transformer.generate_square_subsequent_mask(T) and "
                "is_causal=True")
    return _note(c, s, message, "sees-later", hint)


def _padding(c: Collected, s: Signal) -> Finding:
    d: dict[str, Any] = s.detail
    source, padded, positions = d.get("source", "?"), d.get("padded", 0), d.get("positions", 0)
    where = (f"{padded} of {positions} positions padded (ids equal to the {source} of the "
             f"Embedding that reads them)" if source.startswith("padding_idx") else
             f"{padded} of {positions} positions padded (its {source})")
    if d.get("verdict") != "leaks":
        return _note(c, s, f"the probe: in model '{c.model_name(s.model)}' the output at real "
                           f"positions depends on no padded position ({where})")
    seen = plural(d.get("seen", 0), "padded position")
    odd = [m for m in d.get("masks", []) if m.get("reads") != "same"]
    if odd:
        m = odd[0]
        reads = ("inverted: True at the real positions and False at the padded ones, and "
                 "True means ignore" if m.get("reads") == "inverted" else
                 f"hiding {m.get('hidden')} positions, not the {padded} padded ones")
        return _note(c, s, f"{c.label(s.model, s.fqn)}: its {m.get('arg')} is {reads}; the "
                     f"output depends on {seen} ({where})", "sees-padding",
                     f"{m.get('arg')} must be True where padded: (ids == pad_id)")
    return _note(c, s, f"in model '{c.model_name(s.model)}' the output at real positions "
                 f"depends on {seen} ({where}): a mean or sum over the sequence counts the "
                 "padding", "sees-padding",
                 "weight the pooling by the mask: (h * mask).sum(1) / mask.sum(1)")


_BY_WHAT = {"batch": _batch, "causal": _causal, "padding": _padding}

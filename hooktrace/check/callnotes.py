"""Notes on how the modules ran: called several times per step with gradients on, and a
backward order that does not mirror forward. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding
from hooktrace.check.grouped import cover
from hooktrace.log.names import ancestors
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.check.keys import ModelFqn


def check_info(c: Collected, evaluation: Set[ModelFqn] = frozenset()) -> list[Finding]:
    """Notes on how the modules ran: those called several times per step with gradients on
    (not ``evaluation`` copies, validated in batches), a backward order not mirroring forward."""
    out = []
    # with no backward pass to end a step, every iteration falls in one: nothing per step to say
    stepped = bool(c.backward_steps) or c.unfinished is not None
    models = {m.model for m in c.modules.values()} - c.data_models()  # not data transforms
    copied = {(model, top) for model in {key[0] for key in evaluation}
              for top in cover(c, model, [name for m, name in evaluation if m == model])}
    for model in sorted(models if stepped else ()):
        several = sorted((m for m in c.modules.values()
                          if m.model == model and m.max_calls_per_step > 1
                          and not copied.intersection(
                              (model, name) for name in [*ancestors(m.fqn), m.fqn])),
                         key=lambda m: m.first_seq or 0)
        if several:
            listed = ", ".join(f"{fqn_text(m.fqn)} x{m.max_calls_per_step}"
                               for m in several[:8])
            more = f" and {len(several) - 8} more" if len(several) > 8 else ""
            out.append(Finding(
                "called-several-times", NOTE, c.model_name(model), several[0].fqn, None,
                f"{plural(len(several), 'module')} called several times per step: "
                f"{listed}{more}",
                {"modules": {m.fqn: m.max_calls_per_step for m in several}},
                "expected for shared modules and reused activations; their gradients add up"))
    if c.order_mismatch is not None:
        step, model, name = c.order_mismatch
        out.append(Finding(
            "backward-order", NOTE, c.model_name(model), name, step,
            f"backward order does not mirror forward at step {step}, from "
            f"{c.label(model, name)} (normal for residual and parallel branches)"))
    return out


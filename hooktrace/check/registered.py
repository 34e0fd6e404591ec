"""Tensors a module means to train but does not register: a plain tensor with
``requires_grad=True`` assigned to a module (``self.scale = torch.ones(1, requires_grad=True)``)
is not an ``nn.Parameter``, so ``model.parameters()``, and the optimizer built from it, never
hold it. The tracer names them once per module (``schema.Module.loose``)."""

from __future__ import annotations

from hooktrace.check.collected import Collected
from hooktrace.check.findings import WARNING, Finding
from hooktrace.log.words import plural


def check_loose(c: Collected) -> list[Finding]:
    """A warning per module of a model that trained (a backward pass reached it) holding such
    tensors; a model only evaluated has nothing to train."""
    trained = c.backward_models()
    out = []
    for m in sorted(c.modules.values(), key=lambda m: (m.model, m.first_seq or 0, m.fqn)):
        if not m.loose or m.model not in trained:
            continue
        one = len(m.loose) == 1
        it = "it" if one else "them"
        names = ", ".join(m.loose)
        out.append(Finding(
            "not-a-parameter", WARNING, c.model_name(m.model), m.fqn, None,
            f"{c.label(m.model, m.fqn)} holds {plural(len(m.loose), 'tensor')} with "
            f"requires_grad=True that {'is' if one else 'are'} not an nn.Parameter ({names}): "
            f"model.parameters() does not hold {it}, so an optimizer built from it never "
            f"updates {it}, and state_dict() and .to() leave {it} out",
            {"tensors": list(m.loose)},
            f"register {it}: self.{m.loose[0]} = nn.Parameter(...) in __init__ "
            "(register_buffer(...) for a tensor that should not train)"))
    return out

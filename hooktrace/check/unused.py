"""How a model's modules are called (the ``calls`` kind): registered but never called (a
warning where they hold trainable parameters: DDP needs ``find_unused_parameters=True``; one
note per model for the others), called several times per step with gradients on, and a
backward order that does not mirror forward. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, steps_text
from hooktrace.check.grouped import cover
from hooktrace.check.holds import on_wrapper
from hooktrace.log.names import ancestors
from hooktrace.log.options import TraceOptions
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.keys import ModelFqn


CONTAINERS = {"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}  # never called


def _used_directly(c: Collected, uncalled: set[ModelFqn]) -> set[ModelFqn]:
    """The modules of ``uncalled`` whose parameters got a gradient: their parent's forward
    uses the parameters itself (MultiheadAttention, its out_proj). DDP has no trouble with them."""
    used: set[ModelFqn] = set()
    if uncalled:
        for records in c.param_norms.values():
            for model, names, values in records:
                used.update(key for name, norm in zip(names, values, strict=True)
                            if norm is not None and (key := (model, name)) in uncalled)
    return used


def _holds_called(c: Collected, m: ModuleStats) -> bool:
    """A module never called itself, with called modules below it: a container whose parts
    were called through its methods (a VAE's encode/decode, a LightningModule's training_step)."""
    prefix = m.fqn + "." if m.fqn else ""
    return any(o.calls and o.model == m.model and o.fqn.startswith(prefix) and o is not m
               for o in c.modules.values())


def check_unused(c: Collected) -> list[Finding]:
    if TraceOptions.from_header(c.header).filtered:
        return []  # filtered-out modules would look unused
    # a model that never ran backward (evaluation only, a reloaded checkpoint, a teacher) has
    # no gradient flow to judge
    trained = {key[0] for keys in c.backward.values() for key in keys}
    # a module under two parents is called under the path of the parent that calls it: one
    # name called is the module called (and a second path never taken is no module of its own)
    through = {(m.model, m.alias_of) for m in c.modules.values() if m.alias_of and m.calls}
    unused = [m for m in c.modules.values()
              if m.model in trained and not m.calls and m.cls not in CONTAINERS
              and not m.alias_of and (m.model, m.fqn) not in through]
    used = _used_directly(c, {(m.model, m.fqn) for m in unused if m.trainable})
    beside = on_wrapper(c)  # set on a wrapper, not the model: set-on-wrapper says so
    unused = [m for m in unused if (m.model, m.fqn) not in used | beside
              and not (m.trainable == 0 and _holds_called(c, m))]
    names = {(m.model, m.fqn) for m in unused}
    out: list[Finding] = []
    for m in unused:
        parent = m.fqn.rpartition(".")[0]
        if m.fqn and (m.model, parent) in names:
            continue  # reported with its unused parent
        below = [o for o in unused if o.model == m.model and o.fqn.startswith(m.fqn + ".")]
        if m.cls == "Sequential" and not below and not m.params:
            continue  # an empty Sequential: a placeholder (a block's identity shortcut)
        trainable = m.trainable + sum(o.trainable for o in below)
        out.append(Finding(
            "unused", WARNING if trainable else NOTE, c.model_name(m.model), m.fqn, None,
            f"{m.fqn} ({m.cls}) is registered but never called"
            + (f" ({plural(len(below), 'submodule')}, {plural(trainable, 'trainable parameter')})"
               if below else f" ({plural(trainable, 'trainable parameter')})" if trainable
               else ""),
            {"submodules": len(below), "trainable": trainable},
            "DDP needs find_unused_parameters=True for it; remove it if it is not needed"
            if trainable else "",
        ))
    return [f for f in out if f.severity != NOTE] + _one_note_per_model(out)


def _one_note_per_model(found: list[Finding]) -> list[Finding]:
    """The unused modules without trainable parameters (harmless: EfficientNet builds a
    StochasticDepth in every block and calls it in some), one note per model."""
    out = []
    for model in dict.fromkeys(f.model for f in found if f.severity == NOTE):
        notes = [f for f in found if f.severity == NOTE and f.model == model]
        if len(notes) == 1:
            out += notes
            continue
        listed = ", ".join(f.module for f in notes[:6]) + (
            f" and {len(notes) - 6} more" if len(notes) > 6 else "")
        out.append(Finding(
            "unused", NOTE, model, notes[0].module, None,
            f"{len(notes)} modules without trainable parameters are registered but never "
            f"called: {listed}", {"modules": [f.module for f in notes]}))
    return out


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


def losses_dropped(c: Collected) -> list[Finding]:
    """A loss module run several times a step with gradients on, whose step's backward reaches
    only some of its calls, in every judged step with a backward (two at least): losses were
    computed to train and let go (``loss = ...`` in a gradient-accumulation loop whose one
    backward follows it). Told at each model whose forward calls were let go the same way (at
    the loss module where none was). A result detached on purpose (a pseudo-label, a target)
    still goes into a loss that is backpropagated: no loss call is let go."""
    seen: dict[int, list[tuple[int, int, int]]] = {}  # model -> (step, calls let go, calls)
    steps: dict[tuple[int, int], list[bool]] = {}
    for call in c.calls:
        if call.key[1] == "" and call.grad:
            steps.setdefault((call.key[0], call.step), []).append(call.backed)
    for (model, step), backed in sorted(steps.items()):
        if any(backed):
            seen.setdefault(model, []).append((step, backed.count(False), len(backed)))
    dropped = {m for m, s in seen.items() if len(s) > 1 and all(n for _, n, _ in s)}
    losses = dropped & {model for model, _ in c.losses}
    out = []
    for model in sorted(dropped - losses if losses else ()) or sorted(losses):
        step, n, calls = seen[model][0]
        at = [s for s, _, _ in seen[model]]
        out.append(Finding(
            "loss-dropped", WARNING, c.model_name(model), "", step,
            f"model '{c.model_name(model)}' ran {calls} times in a step with gradients on, and "
            f"a loss with it, but the step's backward reached only {calls - n} of those calls "
            f"({steps_text(at)}): the losses of the other {n} were computed to train and let "
            "go, so their samples never train the model",
            {"steps": at, "calls": calls, "dropped": n, "losses": [c.model_name(m) for m in
                                                                   sorted(losses)]},
            "call backward on each micro-batch's loss (divided by the number of micro-batches), "
            "or add the losses up (loss = loss + ...) before one backward"))
    return out

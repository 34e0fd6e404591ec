"""Modules no gradient reached, and how a model's modules are called. Trainable ones that ran
forward and got no backward (detached, or off the loss path, grouped by subtree), frozen ones (a
note, or a warning beside trainable twins), ones the watch saw lose their gradient, ones run only
under no_grad (one warning per model and run of steps: a backbone's forward under ``no_grad`` by
mistake is one cause, not a warning per layer); tensors a module means to train but does not
register (``self.scale = torch.ones(1, requires_grad=True)``: ``model.parameters()``, and the
optimizer built from it, never hold it); modules registered but never called (a warning where
they hold trainable parameters: DDP needs ``find_unused_parameters=True``), called several times
per step, a backward order that does not mirror forward, and losses computed to train and let
go. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, names_text, steps_text
from hooktrace.check.grouped import cover, frozen_notes, patterns
from hooktrace.check.holds import on_wrapper
from hooktrace.check.trainable import unfrozen_at
from hooktrace.log.names import ancestors
from hooktrace.log.options import TraceOptions
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.keys import ModelFqn, ModelFqns


def _unreached(c: Collected) -> tuple[dict[ModelFqn, list[int]], dict[ModelFqn, list[int]]]:
    """Per module, in one walk of the steps with a backward: the steps it ran forward with
    gradient recording on and none of its calls got a backward, but for the steps where no
    backward reached its model at all while one does in other steps (models trained in turns,
    a GAN's generator run with .detach() for the discriminator's step, are not detached); and
    the steps it ran only under no_grad while its model trained (another of its modules ran
    with gradient recording on and got a backward) and got no backward: a forward under no_grad
    recomputed inside the backward (reversible layers, hand-made checkpointing) gives its
    weights their gradients there."""
    detached: dict[ModelFqn, list[int]] = {}
    no_grad: dict[ModelFqn, list[int]] = {}
    found: dict[tuple[ModelFqns, ModelFqns], ModelFqns] = {}  # the sets are shared between steps
    trained = c.backward_models()
    for step in sorted(c.backward_steps & (c.grad.keys() | c.no_grad.keys())):
        pair = grad, backed = c.grad.get(step, frozenset()), c.backward.get(step, frozenset())
        if pair not in found:
            reached = {key[0] for key in backed}
            found[pair] = frozenset(key for key in grad - backed
                                    if key[0] in reached or key[0] not in trained)
        for key in found[pair]:
            detached.setdefault(key, []).append(step)
        if step in c.no_grad:
            models = {key[0] for key in grad & backed}
            for key in c.no_grad[step]:
                if key not in grad and key not in backed and key[0] in models:
                    no_grad.setdefault(key, []).append(step)
    return detached, no_grad


def check_no_grad(c: Collected, copies: dict[ModelFqn, ModelFqn],
                  explained: Set[ModelFqn] = frozenset()) -> list[Finding]:
    out: list[Finding] = []
    detached: list[tuple[ModuleStats, Finding]] = []
    frozen: list[tuple[ModuleStats, Finding]] = []  # frozen on purpose, all run: notes
    under_no_grad: list[tuple[ModuleStats, list[int]]] = []
    no_backward, no_grad_only = _unreached(c)
    unfrozen = unfrozen_at(c)
    for key in explained:  # starved modules whose boundary ``flow`` names
        no_backward.pop(key, None)
        no_grad_only.pop(key, None)
    for m in c.modules.values():
        if not m.params or not m.calls:
            continue
        if not m.trainable:
            parent = m.fqn.rpartition(".")[0]
            twins = [o for o in c.modules.values() if o is not m and o.model == m.model and o.fqn
                     and o.fqn.rpartition(".")[0] == parent and o.params and o.cls == m.cls
                     and o.trainable]
            trainable_twins = [o.fqn for o in twins]
            # no trainable twin before it: a frozen backbone (a frozen prefix), on purpose
            before = any((o.first_seq or 0) < (m.first_seq or 0) for o in twins)
            finding = Finding(
                "frozen", WARNING if before else NOTE, c.model_name(m.model), m.fqn,
                None,
                f"{m.fqn} ({m.cls}): parameters frozen (requires_grad=False)"
                + (f" until step {unfrozen[(m.model, m.fqn)]}, trainable from then on"
                   if (m.model, m.fqn) in unfrozen else "")
                + (f", while {', '.join(trainable_twins[:3])} beside it train" if trainable_twins
                   else ""),
                {"params": m.params, "trainable_siblings": trainable_twins},
                "call .requires_grad_(True) on it if it should train" if before else "",
            )
            if before or (m.model, m.fqn) in unfrozen:
                out.append(finding)
            else:
                frozen.append((m, finding))
            continue
        steps = no_backward.get((m.model, m.fqn))
        if steps:
            detached.append((m, Finding(
                FindingKind.NO_GRAD, WARNING, c.model_name(m.model), m.fqn, steps[0],
                f"{fqn_text(m.fqn)} ({m.cls}) ran forward but no gradient reached it: "
                f"detached or not on the loss path ({steps_text(steps)})",
                {"steps": steps[:20], "trainable": m.trainable},
                "look for .detach(), .data, .item()/numpy round trips, or an output the loss "
                "does not use",
            )))
        steps = no_grad_only.get((m.model, m.fqn))
        if steps:
            under_no_grad.append((m, steps))
    return (_group_subtrees(c, detached) + frozen_notes(c, frozen, copies) + out
            + ran_under_no_grad(c, under_no_grad))


def check_lost_gradient(c: Collected) -> list[Finding]:
    out = []
    for (model, name), steps in c.lost_gradient.items():
        m = c.modules.get((model, name))
        detail = c.lost_detail.get((model, name), {})
        last, gap = detail.get("last"), detail.get("gap")
        until = f"until step {last}" if isinstance(last, int) else "in earlier steps"
        turns = f" (at least every {gap} steps)" if isinstance(gap, int) and gap > 1 else ""
        out.append(Finding(
            FindingKind.NO_GRAD, WARNING, c.model_name(model), name, steps[0],
            f"{fqn_text(name)} ({m.cls if m else '?'}) received gradient {until}{turns}, then "
            + (f"none from step {last + 1} on (said at {steps_text(steps)})"
               if isinstance(last, int) else
               f"none from step {steps[0]} on ({steps_text(steps)})"),
            {"steps": steps[:20], **({"last": last, "gap": gap} if turns else {})},
            "something started detaching it or stopped using its output in the loss",
        ))
    return out


def _group_subtrees(c: Collected, found: list[tuple[ModuleStats, Finding]]) -> list[Finding]:
    """One finding for the outermost module all of whose trainable modules below (two or more)
    got no gradient (a whole detached branch), in place of one per layer."""
    flagged = {(m.model, m.fqn): f for m, f in found}
    trained = [m for m in c.modules.values() if m.trainable and m.calls]
    grouped: set[ModelFqn] = set()
    out: list[Finding] = []
    for (model, name), f in flagged.items():
        if (model, name) in grouped:
            continue
        for top in ancestors(name):  # outermost first
            below = [m for m in trained if m.model == model
                     and (top == "" or m.fqn.startswith(top + "."))]
            if len(below) >= 2 and all((m.model, m.fqn) in flagged for m in below):
                grouped.update((m.model, m.fqn) for m in below)
                names = ", ".join(m.fqn for m in below[:6]) + (", ..." if len(below) > 6 else "")
                out.append(Finding(
                    f.cause, f.severity, f.model, top, f.step,
                    f"{c.label(model, top)}: no gradient reached any of its {len(below)} "
                    f"trainable modules ({names}): detached or not on the loss path "
                    f"({steps_text(f.evidence['steps'])})",
                    {"modules": [m.fqn for m in below], "steps": f.evidence["steps"],
                     "trainable": sum(m.trainable for m in below)}, f.hint))
                break
        else:
            out.append(f)
    return out


def ran_under_no_grad(c: Collected, found: list[tuple[ModuleStats, list[int]]]) -> list[Finding]:
    """``found``: each module with the steps it ran only under no_grad."""
    groups: dict[tuple[int, tuple[int, ...]], list[ModuleStats]] = {}
    for m, steps in found:
        groups.setdefault((m.model, tuple(steps)), []).append(m)
    out = []
    for (model, run), modules in groups.items():
        steps = list(run)
        if len(modules) == 1:
            m = modules[0]
            out.append(Finding(
                FindingKind.NO_GRAD_UNDER_NO_GRAD, WARNING, c.model_name(model), m.fqn, steps[0],
                f"{fqn_text(m.fqn)} ({m.cls}) ran under torch.no_grad while the rest of its "
                f"model trained: its {m.trainable} trainable parameters get no gradient",
                {"steps": steps[:20]}, "move it out of torch.no_grad(), or freeze it explicitly "
                "with .requires_grad_(False)"))
            continue
        names = [m.fqn for m in modules]
        tops = cover(c, model, names)
        trainable = sum(m.trainable for m in modules)
        out.append(Finding(
            FindingKind.NO_GRAD_UNDER_NO_GRAD, WARNING, c.model_name(model), tops[0], steps[0],
            f"{patterns(tops)} ({plural(len(modules), 'module')} with "
            f"{plural(trainable, 'trainable parameter')}) ran only under torch.no_grad while "
            f"the rest of model '{c.model_name(model)}' trained: they get no gradient "
            f"({steps_text(steps)})",
            {"modules": names, "steps": steps[:20], "trainable": trainable},
            "move their forward out of torch.no_grad(), or freeze them explicitly with "
            ".requires_grad_(False) and leave them out of the optimizer"))
    return out


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
    trained = c.backward_models()
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
            listed = names_text([f"{fqn_text(m.fqn)} x{m.max_calls_per_step}" for m in several], 8)
            out.append(Finding(
                "called-several-times", NOTE, c.model_name(model), several[0].fqn, None,
                f"{plural(len(several), 'module')} called several times per step: {listed}",
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

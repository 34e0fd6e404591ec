"""Modules no gradient reached: trainable ones that ran forward and got no backward (detached,
or off the loss path, grouped by subtree), frozen ones (a note, or a warning beside trainable
twins), ones the watch saw lose their gradient, and ones run only under no_grad (one warning
per model and run of steps, listed by subtree: a backbone's forward under ``no_grad`` by
mistake is one cause, not a warning per layer); and tensors a module means to train but does
not register (``self.scale = torch.ones(1, requires_grad=True)`` is not an ``nn.Parameter``:
``model.parameters()``, and the optimizer built from it, never hold it; the tracer names them
once per module, ``schema.Module.loose``). Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

from collections.abc import Iterator, Set
from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, WARNING, Finding, FindingKind, steps_text
from hooktrace.check.grouped import cover, frozen_notes, patterns
from hooktrace.check.trainable import unfrozen_at
from hooktrace.log.names import ancestors
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.keys import ModelFqn, ModelFqns


def _siblings(c: Collected, m: ModuleStats) -> list[ModuleStats]:
    parent = m.fqn.rpartition(".")[0]
    return [o for o in c.modules.values()
            if o is not m and o.model == m.model and o.fqn.rpartition(".")[0] == parent
            and o.fqn != "" and o.params]


def _detached(c: Collected) -> dict[ModelFqn, list[int]]:
    """Per module, the steps it ran forward with gradient recording on, in a step with a
    backward, and none of its calls got a backward; not the steps where no backward reached its
    model at all while one does in other steps: models trained in turns (a GAN's generator run
    with .detach() for the discriminator's step) are not detached."""
    out: dict[ModelFqn, list[int]] = {}
    found: dict[tuple[ModelFqns, ModelFqns], ModelFqns] = {}  # the sets are shared between steps
    trained = {key[0] for keys in c.backward.values() for key in keys}
    for step in sorted(c.grad):
        if step in c.backward_steps:
            pair = (c.grad[step], c.backward.get(step, frozenset()))
            if pair not in found:
                reached = {key[0] for key in pair[1]}
                found[pair] = frozenset(key for key in pair[0] - pair[1]
                                        if key[0] in reached or key[0] not in trained)
            for key in found[pair]:
                out.setdefault(key, []).append(step)
    return out


def _no_grad_only(c: Collected) -> dict[ModelFqn, list[int]]:
    """Per module, the steps it ran only under no_grad while its model trained (another of its
    modules ran with gradient recording on and got a backward), and got no backward: a
    forward under no_grad recomputed inside the backward (reversible layers, hand-made
    checkpointing) gives its weights their gradients there."""
    out: dict[ModelFqn, list[int]] = {}
    for step in sorted(c.no_grad):
        if step in c.backward_steps:
            grad = c.grad.get(step, frozenset())
            backed = c.backward.get(step, frozenset())
            trained = {key[0] for key in grad & backed}
            for key in c.no_grad[step]:
                if key not in grad and key not in backed and key[0] in trained:
                    out.setdefault(key, []).append(step)
    return out


def check_no_grad(c: Collected, explained: Set[ModelFqn] = frozenset()) -> list[Finding]:
    out: list[Finding] = []
    detached: list[tuple[ModuleStats, Finding]] = []
    frozen: list[tuple[ModuleStats, Finding]] = []  # frozen on purpose, all run: notes
    under_no_grad: list[tuple[ModuleStats, list[int]]] = []
    no_backward, no_grad_only = _detached(c), _no_grad_only(c)
    unfrozen = unfrozen_at(c)
    for key in explained:  # starved modules whose boundary ``flow`` names
        no_backward.pop(key, None)
        no_grad_only.pop(key, None)
    for m in c.modules.values():
        if not m.params or not m.calls:
            continue
        if not m.trainable:
            twins = [o for o in _siblings(c, m) if o.cls == m.cls and o.trainable]
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
    return (_group_subtrees(c, detached) + frozen_notes(c, frozen) + out
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


def _subtrees(found: list[tuple[ModuleStats, Finding]], candidates: list[ModuleStats]
              ) -> Iterator[tuple[Finding, str | None, list[ModuleStats]]]:
    """Each flagged module's finding with the outermost module above it all of whose
    ``candidates`` below (two or more) are flagged, and those; or with None, alone."""
    flagged = {(m.model, m.fqn): f for m, f in found}
    grouped: set[ModelFqn] = set()
    for (model, name), finding in flagged.items():
        if (model, name) in grouped:
            continue
        for top in ancestors(name):  # outermost first
            below = [m for m in candidates if m.model == model
                     and (top == "" or m.fqn.startswith(top + "."))]
            if len(below) >= 2 and all((m.model, m.fqn) in flagged for m in below):
                grouped.update((m.model, m.fqn) for m in below)
                yield finding, top, below
                break
        else:
            yield finding, None, []


def _group_subtrees(c: Collected, found: list[tuple[ModuleStats, Finding]]) -> list[Finding]:
    """One finding for a module all of whose trainable modules below got no gradient (a whole
    detached branch), instead of one per layer."""
    out: list[Finding] = []
    trained = [m for m in c.modules.values() if m.trainable and m.calls]
    for finding, top, below in _subtrees(found, trained):
        if top is None:
            out.append(finding)
            continue
        names = ", ".join(m.fqn for m in below[:6]) + (", ..." if len(below) > 6 else "")
        out.append(Finding(
            finding.cause, finding.severity, finding.model, top, finding.step,
            f"{c.label(below[0].model, top)}: no gradient reached any of its {len(below)} "
            f"trainable modules ({names}): detached or not on the loss path "
            f"({steps_text(finding.evidence['steps'])})",
            {"modules": [m.fqn for m in below], "steps": finding.evidence["steps"],
             "trainable": sum(m.trainable for m in below)},
            finding.hint))
    return out


_NO_GRAD_HINT = ("move it out of torch.no_grad(), or freeze it explicitly with "
                 ".requires_grad_(False)")


def ran_under_no_grad(c: Collected, found: list[tuple[ModuleStats, list[int]]]) -> list[Finding]:
    """``found``: each module with the steps it ran only under no_grad."""
    groups: dict[tuple[int, tuple[int, ...]], list[ModuleStats]] = {}
    for m, steps in found:
        groups.setdefault((m.model, tuple(steps)), []).append(m)
    out = []
    for (model, run), modules in groups.items():
        steps = list(run)
        if len(modules) == 1:
            out.append(_one(c, modules[0], steps))
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


def _one(c: Collected, m: ModuleStats, steps: list[int]) -> Finding:
    return Finding(
        FindingKind.NO_GRAD_UNDER_NO_GRAD, WARNING, c.model_name(m.model), m.fqn, steps[0],
        f"{fqn_text(m.fqn)} ({m.cls}) ran under torch.no_grad while the rest of its "
        f"model trained: its {m.trainable} trainable parameters get no gradient",
        {"steps": steps[:20]}, _NO_GRAD_HINT)


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

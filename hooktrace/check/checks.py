"""Gradient-flow diagnostics: one rank's collected log in, findings out. Pure: no files, no
printing, no torch.

``collect`` streams a log once into per-module aggregates (``Collected``); each ``check_*``
function turns them into findings and ``check_all`` runs them all. Reading the logs is
``checklog``'s job; printing them, ``report``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from typing import TYPE_CHECKING

from hooktrace.check import causes, copies, flow, nogradonly, notes, oplines, units
from hooktrace.check.crash import check_crash
from hooktrace.check.custom import check_custom
from hooktrace.check.findings import (
    NOTE,
    SEVERITY_ORDER,
    WARNING,
    Finding,
    Thresholds,
    after_causes,
    steps_text,
)
from hooktrace.check.frozen import frozen_notes
from hooktrace.check.grouped import cover
from hooktrace.check.holds import on_wrapper
from hooktrace.check.loop import check_loop
from hooktrace.check.losses import check_losses
from hooktrace.check.lossterms import absorb, check_loss_terms
from hooktrace.check.magnitudes import check_magnitudes, start, start_orders
from hooktrace.check.nonfinite import check_nonfinite
from hooktrace.check.probed import check_probed
from hooktrace.check.registered import check_loose
from hooktrace.check.relations import check_relations
from hooktrace.check.scaling import check_scaling, explain
from hooktrace.check.shared import check_shared_targets
from hooktrace.check.trainable import drop_frozen, frozen_since, settle_frozen, unfrozen_at
from hooktrace.check.unseen import check_unseen
from hooktrace.log.names import ancestors
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.boundary import Flow
    from hooktrace.check.collected import Collected, Keys, ModuleKey, ModuleStats

CONTAINERS = {"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}  # never called


# -- the checks: each returns findings -------------------------------------------------------

def _siblings(c: Collected, m: ModuleStats) -> list[ModuleStats]:
    parent = m.name.rpartition(".")[0]
    return [o for o in c.modules.values()
            if o is not m and o.model == m.model and o.name.rpartition(".")[0] == parent
            and o.name != "" and o.params]


def _detached(c: Collected) -> dict[ModuleKey, list[int]]:
    """Per module, the steps it ran forward with gradient recording on, in a step with a
    backward, and none of its calls got a backward; not the steps where no backward reached its
    model at all while one does in other steps: models trained in turns (a GAN's generator run
    with .detach() for the discriminator's step) are not detached."""
    out: dict[ModuleKey, list[int]] = {}
    found: dict[tuple[Keys, Keys], Keys] = {}  # the sets are shared between steps
    trained = c.backward_models()
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


def _no_grad_only(c: Collected) -> dict[ModuleKey, list[int]]:
    """Per module, the steps it ran only under no_grad while its model trained (another of its
    modules ran with gradient recording on and got a backward), and got no backward: a
    forward under no_grad recomputed inside the backward (reversible layers, hand-made
    checkpointing) gives its weights their gradients there."""
    out: dict[ModuleKey, list[int]] = {}
    for step in sorted(c.no_grad):
        if step in c.backward_steps:
            grad = c.grad.get(step, frozenset())
            backed = c.backward.get(step, frozenset())
            trained = {key[0] for key in grad & backed}
            for key in c.no_grad[step]:
                if key not in grad and key not in backed and key[0] in trained:
                    out.setdefault(key, []).append(step)
    return out


def check_no_grad(c: Collected, explained: Set[ModuleKey] = frozenset()) -> list[Finding]:
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
            trainable_twins = [o.name for o in twins]
            # no trainable twin before it: a frozen backbone (a frozen prefix), on purpose
            before = any((o.first_seq or 0) < (m.first_seq or 0) for o in twins)
            finding = Finding(
                "frozen", WARNING if before else NOTE, c.model_name(m.model), m.name,
                None,
                f"{m.name} ({m.cls}): parameters frozen (requires_grad=False)"
                + (f" until step {unfrozen[(m.model, m.name)]}, trainable from then on"
                   if (m.model, m.name) in unfrozen else "")
                + (f", while {', '.join(trainable_twins[:3])} beside it train" if trainable_twins
                   else ""),
                {"params": m.params, "trainable_siblings": trainable_twins},
                "call .requires_grad_(True) on it if it should train" if before else "",
            )
            if before or (m.model, m.name) in unfrozen:
                out.append(finding)
            else:
                frozen.append((m, finding))
            continue
        steps = no_backward.get((m.model, m.name))
        if steps:
            detached.append((m, Finding(
                "no-grad", WARNING, c.model_name(m.model), m.name, steps[0],
                f"{fqn_text(m.name)} ({m.cls}) ran forward but no gradient reached it: "
                f"detached or not on the loss path ({steps_text(steps)})",
                {"steps": steps[:20], "trainable": m.trainable},
                "look for .detach(), .data, .item()/numpy round trips, or an output the loss "
                "does not use",
            )))
        steps = no_grad_only.get((m.model, m.name))
        if steps:
            under_no_grad.append((m, steps))
    return (_group_subtrees(c, detached) + frozen_notes(c, frozen) + out
            + nogradonly.no_grad_only(c, under_no_grad))


def check_lost_gradient(c: Collected) -> list[Finding]:
    out = []
    for (model, name), steps in c.lost_gradient.items():
        m = c.modules.get((model, name))
        detail = c.lost_detail.get((model, name), {})
        last, gap = detail.get("last"), detail.get("gap")
        until = f"until step {last}" if isinstance(last, int) else "in earlier steps"
        turns = f" (at least every {gap} steps)" if isinstance(gap, int) and gap > 1 else ""
        out.append(Finding(
            "no-grad", WARNING, c.model_name(model), name, steps[0],
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
    flagged = {(m.model, m.name): f for m, f in found}
    grouped: set[ModuleKey] = set()
    for (model, name), finding in flagged.items():
        if (model, name) in grouped:
            continue
        for top in ancestors(name):  # outermost first
            below = [m for m in candidates if m.model == model
                     and (top == "" or m.name.startswith(top + "."))]
            if len(below) >= 2 and all((m.model, m.name) in flagged for m in below):
                grouped.update((m.model, m.name) for m in below)
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
        names = ", ".join(m.name for m in below[:6]) + (", ..." if len(below) > 6 else "")
        out.append(Finding(
            finding.kind, finding.severity, finding.model, top, finding.step,
            f"{c.label(below[0].model, top)}: no gradient reached any of its {len(below)} "
            f"trainable modules ({names}): detached or not on the loss path "
            f"({steps_text(finding.evidence['steps'])})",
            {"modules": [m.name for m in below], "steps": finding.evidence["steps"],
             "trainable": sum(m.trainable for m in below)},
            finding.hint))
    return out


def _used_directly(c: Collected, uncalled: set[ModuleKey]) -> set[ModuleKey]:
    """The modules of ``uncalled`` whose parameters got a gradient: their parent's forward
    uses the parameters itself (MultiheadAttention, its out_proj). DDP has no trouble with them."""
    used: set[ModuleKey] = set()
    if uncalled:
        for records in c.param_norms.values():
            for model, names, values in records:
                used.update(key for name, norm in zip(names, values, strict=True)
                            if norm is not None and (key := (model, name)) in uncalled)
    return used


def _holds_called(c: Collected, m: ModuleStats) -> bool:
    """A module never called itself, with called modules below it: a container whose parts
    were called through its methods (a VAE's encode/decode, a LightningModule's training_step)."""
    prefix = m.name + "." if m.name else ""
    return any(o.calls and o.model == m.model and o.name.startswith(prefix) and o is not m
               for o in c.modules.values())


def check_unused(c: Collected) -> list[Finding]:
    options = c.header.options
    if options.get("include") or options.get("exclude"):
        return []  # filtered-out modules would look unused
    # a model that never ran backward (evaluation only, a reloaded checkpoint, a teacher) has
    # no gradient flow to judge
    trained = c.backward_models()
    # a module under two parents is called under the path of the parent that calls it: one
    # name called is the module called (and a second path never taken is no module of its own)
    through = {(m.model, m.alias_of) for m in c.modules.values() if m.alias_of and m.calls}
    unused = [m for m in c.modules.values()
              if m.model in trained and not m.calls and m.cls not in CONTAINERS
              and not m.alias_of and (m.model, m.name) not in through]
    used = _used_directly(c, {(m.model, m.name) for m in unused if m.trainable})
    beside = on_wrapper(c)  # set on a wrapper, not the model: set-on-wrapper says so
    unused = [m for m in unused if (m.model, m.name) not in used | beside
              and not (m.trainable == 0 and _holds_called(c, m))]
    names = {(m.model, m.name) for m in unused}
    out: list[Finding] = []
    for m in unused:
        parent = m.name.rpartition(".")[0]
        if m.name and (m.model, parent) in names:
            continue  # reported with its unused parent
        below = [o for o in unused if o.model == m.model and o.name.startswith(m.name + ".")]
        if m.cls == "Sequential" and not below and not m.params:
            continue  # an empty Sequential: a placeholder (a block's identity shortcut)
        trainable = m.trainable + sum(o.trainable for o in below)
        out.append(Finding(
            "unused", WARNING if trainable else NOTE, c.model_name(m.model), m.name, None,
            f"{m.name} ({m.cls}) is registered but never called"
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


def check_info(c: Collected, evaluation: Set[ModuleKey] = frozenset()) -> list[Finding]:
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
                              (model, name) for name in [*ancestors(m.name), m.name])),
                         key=lambda m: m.first_seq or 0)
        if several:
            listed = ", ".join(f"{fqn_text(m.name)} x{m.max_calls_per_step}"
                               for m in several[:8])
            more = f" and {len(several) - 8} more" if len(several) > 8 else ""
            out.append(Finding(
                "called-several-times", NOTE, c.model_name(model), several[0].name, None,
                f"{plural(len(several), 'module')} called several times per step: "
                f"{listed}{more}",
                {"modules": {m.name: m.max_calls_per_step for m in several}},
                "expected for shared modules and reused activations; their gradients add up"))
    if c.order_mismatch is not None:
        step, model, name = c.order_mismatch
        out.append(Finding(
            "backward-order", NOTE, c.model_name(model), name, step,
            f"backward order does not mirror forward at step {step}, from "
            f"{c.label(model, name)} (normal for residual and parallel branches)"))
    return out


def _add_sources(c: Collected, findings: list[Finding]) -> None:
    """Where to look for each finding's module: its class's forward as the log recorded it, or,
    for torch's own classes (none recorded), the forward of the nearest module around it that
    has one (the user's code that calls it)."""
    if not c.sources:
        return
    models = {c.model_name(i): i for i in c.models}
    for f in findings:
        if f.kind in ("loss-term-cut", "loss-target-grad"):
            continue  # in the loss, outside every forward: its own line says where
        model = models.get(f.model, -1)
        for name in [f.module, *reversed(ancestors(f.module))]:
            m = c.modules.get((model, name))
            if m is not None and m.cls in c.sources:
                f.source = f"{c.sources[m.cls]} ({m.cls}.forward)"
                break


def _explained(c: Collected, found: Flow) -> set[ModuleKey]:
    """The modules whose small or missing gradients a boundary explains: those it starves, the
    never-called ones inside them (MultiheadAttention's out_proj, whose parameters its parent
    uses), and the modules whose own parameters are used before it in forward (a ViT's class
    token, on its root)."""
    starved = found.victims
    starts = start_orders(c)
    before = set()
    for b in found.boundaries.values():
        limit = start(starts, b.key)
        before |= {key for key, m in c.modules.items() if key[0] == b.key[0] and m.trainable
                   and start(starts, key) < limit}
    return starved | before | {key for key, m in c.modules.items() if not m.calls and any(
        (key[0], name) in starved for name in ancestors(key[1]))}


def check_all(c: Collected, thresholds: Thresholds) -> list[Finding]:
    """Every finding of one rank's collected log, most severe first, then in step and forward
    order. Leaves ``c`` as the checks need it (an unfinished backward's step is not judged)."""
    if c.unfinished is not None:  # a backward that raised starves every module before it
        c.backward_steps.discard(c.unfinished[0])
    settle_frozen(c)  # a freeze inside the first forward: frozen from the start
    flowed = flow.analyse([call for call in c.calls if c.unfinished is None
                           or call.step != c.unfinished[0]], c.modules, thresholds)
    drop_frozen(c, flowed)
    turns = units.trained_in_turns(c)
    flowed.drop_victims(turns, units.MISSED)
    evaluation = copies.evaluation_copies(c)
    flowed.drop_victims(evaluation)
    explained = _explained(c, flowed) | set(frozen_since(c)) | evaluation
    findings = [*check_crash(c), *check_unseen(c), *check_nonfinite(c), *check_loop(c),
                *check_custom(c), *check_probed(c),
                *causes.findings(flowed, c.modules, c.models),
                *check_no_grad(c, explained | turns), *check_lost_gradient(c),
                *check_magnitudes(c, thresholds, explained),
                *check_unused(c), *check_loose(c), *check_losses(c),
                *check_loss_terms(c), *check_info(c, evaluation),
                *check_scaling(c), *check_shared_targets(c), *check_relations(c),
                *copies.copies_notes(c, evaluation)]
    findings = absorb(c, findings)  # a gradient cut in the loss, not inside a forward
    units.zero_before_moving(c, flowed, findings)
    explain(findings)
    _add_sources(c, findings)
    oplines.explain(findings, c, flowed)
    findings = notes.settle(c, findings)
    order = {m.name: m.first_seq or 0 for m in c.modules.values()}
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.step if f.step is not None else -1,
                                 order.get(f.module, 0), f.kind))
    return after_causes(findings)

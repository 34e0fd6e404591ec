"""Modules that ran only under ``torch.no_grad()`` in steps where the rest of their model
trained: one warning per model and run of steps, listing them by subtree (a backbone's forward
under ``no_grad`` by mistake is one cause, not a warning per layer). Pure: a ``Collected`` in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import WARNING, Finding, FindingKind, steps_text
from hooktrace.check.grouped import cover, patterns
from hooktrace.log.words import fqn_text, plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected, ModuleStats

HINT = "move it out of torch.no_grad(), or freeze it explicitly with .requires_grad_(False)"


def no_grad_only(c: Collected, found: list[tuple[ModuleStats, list[int]]]) -> list[Finding]:
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
        {"steps": steps[:20]}, HINT)

"""Notes that repeat one cause over many modules, one per model and cause; and the BatchNorm
advice that does not fit a frozen copy of a trained module. Pure: findings in, findings out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import NOTE, Finding, FindingKind
from hooktrace.check.grouped import copies, inside, patterns
from hooktrace.log.words import plural

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected

# the notes that come one per module of a cause: a frozen BatchNorm in train mode, a layer
# initialised to zero (which passes nothing back before its first update)
REPEATING = (FindingKind.FROZEN_BN_TRAINING, FindingKind.ZERO_GRADIENT)


def settle(c: Collected, findings: list[Finding]) -> list[Finding]:
    """``findings`` without the ``.eval()`` advice for the BatchNorms of a frozen copy of a
    trained module (a BYOL target or an EMA copy runs in train mode on purpose: its statistics
    follow the batches as the online network's do), and with each ``REPEATING`` note that
    repeats over several modules of a model as one note listing them."""
    if any(f.cause == FindingKind.FROZEN_BN_TRAINING for f in findings):
        models = {c.model_name(i): i for i in c.models}
        tops = list(copies(c))
        findings = [f for f in findings if f.cause != FindingKind.FROZEN_BN_TRAINING
                    or not inside((models.get(f.model, -1), f.module), tops)]
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        if f.severity == NOTE and f.cause in REPEATING:
            groups.setdefault((f.cause, f.model, f.hint), []).append(f)
    out = []
    for f in findings:
        group = groups.get((f.cause, f.model, f.hint)) if f.severity == NOTE else None
        if group is None or len(group) == 1:
            out.append(f)
        elif group[0] is f:
            out.append(_one(group))
    return out


def _one(group: list[Finding]) -> Finding:
    first, rest = group[0], [f.module for f in group[1:]]
    return Finding(
        first.cause, NOTE, first.model, first.module, first.step,
        f"{first.message}; the same at {plural(len(rest), 'more module')} (in all: "
        f"{patterns(f.module for f in group)})",
        {**first.evidence, "modules": [f.module for f in group]}, first.hint,
        source=first.source)

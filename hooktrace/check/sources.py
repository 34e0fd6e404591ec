"""Where to look for each finding's module: its class's forward as the log recorded it."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hooktrace.check.findings import Finding, FindingKind
from hooktrace.log.names import ancestors

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected


def with_sources(c: Collected, findings: list[Finding]) -> list[Finding]:
    """``findings``, each with its module's class's forward as the log recorded it, or, for
    torch's own classes (none recorded), the forward of the nearest module around it that has
    one (the user's code that calls it)."""
    if not c.sources:
        return findings
    models = {c.model_name(i): i for i in c.models}
    return [_with_source(c, f, models.get(f.model, -1)) for f in findings]


def _with_source(c: Collected, f: Finding, model: int) -> Finding:
    if f.cause in (FindingKind.LOSS_TERM_CUT, FindingKind.LOSS_TARGET_GRAD):
        return f  # in the loss, outside every forward: its own line says where
    for name in [f.module, *reversed(ancestors(f.module))]:
        m = c.modules.get((model, name))
        if m is not None and m.cls in c.sources:
            return replace(f, source=f"{c.sources[m.cls]} ({m.cls}.forward)")
    return f

"""A run hooktrace did not see, and compiled code it saw run eagerly.

A log with no event is never "no problems found": the one line ``log/unseen.py`` says why
(the script's exit status and line, no ``nn.Module``, compiled code unseen, every call
filtered out) is an error. Not where the tracer followed backward passes of a model (the
end record's steps) outside the steps it records: those steps were watched, and their
anomalies are the findings; unless the model ran compiled code in them, which no step recorded
eagerly first. A run whose recorded steps ran ``torch.compile``'d code eagerly
(the ``compiled-eager`` signal) gets one note saying so. Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooktrace.check.findings import ERROR, NOTE, Finding, FindingKind
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import EndStatus, SignalKind
from hooktrace.log.unseen import nothing_seen

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected

_CRASHED = {EndStatus.INTERRUPTED}  # said by the crash check, as is an error other than SystemExit


def check_unseen(c: Collected) -> list[Finding]:
    end = c.end
    options = TraceOptions.from_header(c.header)
    # watched steps judged the modules they saw; compiled code run in none but watched steps
    # was never seen (its steps are counted at backward()'s return, judged by nothing)
    followed = end is not None and end.steps and not end.compiled and not options.filtered
    if end is None or c.events or followed or end.status in _CRASHED or (
            end.status == EndStatus.ERROR and (end.error or {}).get("type", "SystemExit")
            != "SystemExit"):
        return _eager(c)
    why = nothing_seen(options, end, len(c.models))
    if why is None:
        return []
    return [Finding(
        FindingKind.NOTHING_TRACED, ERROR, "", "", None, why,
        {"exit_code": end.exit_code, "backward": end.backward or 0,
         "compiled": end.compiled or 0, "models": len(c.models)},
        "nothing was checked: run the script to where its model trains (hooktrace run "
        "script.py ARGS)")]


def _eager(c: Collected) -> list[Finding]:
    first = next((s for s in c.signals if s.kind == SignalKind.COMPILED_EAGER), None)
    if first is None:
        return []
    return [Finding(
        FindingKind.COMPILED_EAGER, NOTE, c.model_name(first.model), first.fqn, None,
        "recorded steps ran torch.compile'd code eagerly (torch.compiler.set_stance"
        "(\"force_eager\")), so every module call was seen; the other steps ran it compiled")]

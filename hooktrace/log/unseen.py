"""Why a run's log holds no event, in one line: what ``check`` finds and ``run`` says last.

A run hooktrace did not see is never a pass: a script that stopped or exited non-zero before
any model ran, a finished script that called no ``nn.Module``, ``backward()`` calls with no
module call seen (compiled or scripted code, a model that is not an ``nn.Module``), or every
call left out by ``--include``/``--exclude`` or before the steps ``--steps`` selects.
Standard library only: the reading side says it without torch.
"""

from __future__ import annotations

from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import End, EndStatus
from hooktrace.log.words import plural


def _site(end: End) -> str:
    """`` (train.py:12: args = parser.parse_args())``: where the script stopped, when known."""
    error = end.error or {}
    if not error.get("file"):
        return ""
    code = f": {error['code']}" if error.get("code") else ""
    return f" ({error['file']}:{error.get('line')}{code})"


def stopped_early(end: End) -> str | None:
    """How a run with no event stopped before any model ran; None when it finished (status 0).
    An error or a signal is ``check``'s crash finding; a non-zero ``sys.exit`` is this one's."""
    error = end.error or {}
    kind = error.get("type")
    if end.status == EndStatus.INTERRUPTED:
        return "the run was interrupted before any module call was recorded"
    if end.status != EndStatus.ERROR:
        return None
    if kind == "SystemExit" or kind is None:
        return (f"the script exited with status {end.exit_code} before any model "
                f"ran{_site(end)}")
    return f"the script stopped with {kind} before any model ran{_site(end)}"


def nothing_seen(options: TraceOptions, end: End | None, models: int) -> str | None:
    """Why the run's log holds no event, or None where it holds some (or has no end: killed,
    or still running). ``options``: what was recorded; ``models``: the model records of the log."""
    if end is None or end.events:
        return None
    stopped = stopped_early(end)
    if stopped is not None:
        return stopped
    filters = [f"--{key} {' '.join(globs)}" for key, globs in
               (("include", options.include), ("exclude", options.exclude)) if globs]
    if models and filters:
        return (f"every module call was left out by {' and '.join(filters)} "
                f"({plural(models, 'model')} seen): no fqn matched")
    if end.compiled:
        steps = f" (--steps {options.steps.text})" if options.steps.text else ""
        return (f"torch.compile'd code ran ({plural(end.compiled, 'graph')} compiled) and no "
                f"module call in it was recorded{steps}")
    if models and options.steps.text:
        return (f"no step that --steps {options.steps.text} selects ran: the run completed "
                f"{plural(end.steps, 'step')} ({plural(models, 'model')} seen)")
    if end.backward:
        return (f"backward() ran {plural(end.backward, 'time')} but no nn.Module call was "
                f"seen: the model is not an nn.Module (plain tensors, torch.nn.functional) or "
                f"ran where module hooks do not fire (TorchScript, CUDA graph replays)")
    if models:
        return f"no module call was recorded ({plural(models, 'model')} seen)"
    return "the script finished without calling any nn.Module: nothing to check"

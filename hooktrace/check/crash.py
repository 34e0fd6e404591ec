"""A run that did not finish, a run hooktrace did not see, and compiled code it ran eagerly.

A backward pass that raised (autograd's "modified by an inplace operation") is named by the module
whose backward was running; any other error by the module whose call raised it and the line of the
user's code, as the end record keeps them. A run that stopped without an error of its own (killed:
no end record; interrupted by a signal) is said with the last step it completed; ``sys.exit(n)``
is the script's own choice of status, a run that finished (a framework's runner exits so after
training). A log with no event is never "no problems found": the one line ``log/unseen.py`` says
why (the exit status and line, no ``nn.Module``, compiled code unseen, every call filtered out)
is an error; not where the tracer followed backward passes outside the steps it records (watched:
their anomalies are the findings), unless the model ran compiled code in them. Recorded steps
that ran ``torch.compile``'d code eagerly get one note. Pure: a ``Collected`` in, findings out."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from hooktrace.check.findings import ERROR, NOTE, Finding, FindingKind
from hooktrace.log.errors import plain
from hooktrace.log.options import TraceOptions
from hooktrace.log.schema import EndStatus, SignalKind
from hooktrace.log.unseen import nothing_seen

if TYPE_CHECKING:
    from hooktrace.check.collected import Collected
    from hooktrace.log.schema import End


_NOT_A_CRASH = {"SystemExit", "KeyboardInterrupt"}  # an exit status the script chose

# a phrase of autograd's message -> what it usually means and what to do
_HINTS = (
    ("modified by an inplace operation",
     "an in-place operation (x.mul_(), x += ..., ReLU(inplace=True), a slice assignment) "
     "changed a tensor this backward needs: make it out of place; "
     "torch.autograd.set_detect_anomaly(True) shows the forward line"),
    ("backward through the graph a second time",
     "a tensor from an earlier step is used again (an RNN hidden state carried across "
     "batches, a running sum of losses): detach it at every step (h = h.detach()); "
     "retain_graph=True only if you really backpropagate through it twice"),
    ("does not require grad and does not have a grad_fn",
     "nothing the loss is computed from requires a gradient: every parameter frozen, the "
     "forward run under torch.no_grad(), or the loss built from .detach(), .item() or numpy "
     "values"),
    ("leaf Variable that requires grad is being used in an in-place operation",
     "forward changes a parameter in place (self.weight.mul_(mask)): compute a new tensor "
     "instead (w = self.weight * mask, then F.linear(x, w)), or change it under "
     "torch.no_grad() outside forward"),
)


def _hint(text: str, fallback: str) -> str:
    return next((hint for phrase, hint in _HINTS if phrase in text), fallback)


_LIMIT = 600  # characters of an error message in a finding


def message_text(message: str, limit: int = _LIMIT) -> str:
    """An error message on one line, without colour codes or torch's ". Hint:"; past
    ``limit`` characters, its start and its end (a long message's last line says its cause),
    each cut between words, around "...". The log keeps it whole."""
    lines = [" ".join(line.split()) for line in plain(message).split(". Hint:")[0].splitlines()]
    lines = [line for line in lines if line]
    text = " ".join(lines)
    if len(text) <= limit:
        return text
    last = lines[-1]
    tail = last if len(lines) > 1 and len(last) <= limit // 2 else _words(text, -(limit // 3))
    return f"{_words(text, limit - len(tail) - 5)} ... {tail}"


def _words(text: str, n: int) -> str:
    """The first ``n`` characters of ``text`` (the last ``-n`` when negative), without the word
    the cut would split (unless that word is all there is)."""
    if n >= 0:
        cut = text[:n]
        return cut[:cut.rfind(" ")] if text[n:n + 1] not in ("", " ") and " " in cut else cut
    cut = text[n:]
    return cut[cut.find(" ") + 1:] if text[n - 1:n] != " " and " " in cut else cut


def check_crash(c: Collected) -> list[Finding]:
    """The error the run stopped on; else how it stopped, where it did not finish."""
    if c.end is None or c.end.status != EndStatus.ERROR or not c.end.error:
        return _stopped(c)
    error = c.end.error
    kind = str(error.get("type", "error"))
    if kind in _NOT_A_CRASH:
        return _stopped(c)
    text = message_text(str(error.get("message", "")))
    where = f" ({error['file']}:{error['line']})" if error.get("file") else ""
    evidence: dict[str, Any] = {"error": kind}
    if where:
        evidence["line"] = f"{error['file']}:{error['line']}"
    if c.unfinished is not None:
        step, (model, name) = c.unfinished
        return [Finding(
            FindingKind.BACKWARD_ERROR, ERROR, c.model_name(model), name, step,
            f"the backward pass of step {step} raised {kind} while the backward of "
            f"{c.label(model, name)} ran{where}: {text}", evidence,
            _hint(text, "the gradient of the modules before it was never computed: fix this "
                        "error first"))]
    step = c.end.steps
    raised_in, fqn = error.get("model"), error.get("module")
    if isinstance(raised_in, int) and isinstance(fqn, str):
        return [Finding(
            "forward-error", ERROR, c.model_name(raised_in), fqn, step,
            f"the script stopped at step {step}: {c.label(raised_in, fqn)} raised {kind} in its "
            f"forward{where}: {text}", evidence,
            _hint(text, "the modules after it in forward never ran: fix this error first"))]
    stopped_at: int | None = step
    if not _ran(c):  # no model to point at, and no step begun
        at, who, about, stopped_at = "before any model ran,", "", "", None
    else:
        frozen = [c.model_name(m) for m in sorted(c.models) if _all_frozen(c, m)]
        at, who = f"at step {step}", frozen[0] if frozen else _last_model(c)
        about = (f"; every parameter of model '{frozen[0]}' is frozen (requires_grad=False)"
                 if frozen else "")
    return [Finding(
        "script-error", ERROR, who, "", stopped_at,
        f"the script stopped {at} with {kind}{where}: {text}{about}", evidence,
        _hint(text, "the run did not finish: fix this error first"))]


def _stopped(c: Collected) -> list[Finding]:
    """A run that stopped without an error of its own: killed (no end record), interrupted
    by a signal; with the last step it completed."""
    ended = _how(c)
    if ended is None:
        return []
    how, status, hint = ended
    evidence: dict[str, Any] = {"status": status}
    if c.end is not None and c.end.exit_code is not None:
        evidence["exit_code"] = c.end.exit_code
    if not _ran(c):
        return [Finding("stopped", ERROR, "", "", None,
                        f"the run did not finish: {how}, before any model ran", evidence, hint)]
    done = c.last_step if c.end is None else c.end.steps - 1
    if done is None or done < 0:
        done, last = None, "before it completed a step"
    else:
        last = f"the last step it completed is {done}{_maybe_later(c, done)}"
    evidence["last_step"] = done
    return [Finding("stopped", ERROR, _last_model(c), "", 0 if done is None else done + 1,
                    f"the run did not finish: {how}; {last}", evidence, hint)]


def _how(c: Collected) -> tuple[str, str, str] | None:
    """How a run that did not finish ended, its ``status`` in the evidence, and a hint; None
    for a run that finished (or crashed: ``check_crash`` says it)."""
    end = c.end
    if end is None:
        return ("its log has no end record, so the process was killed (kill -9, out of memory, "
                "a job's time limit) or is still running", "killed",
                "a process killed without a word is most often out of memory (the kernel's OOM "
                "killer: dmesg says so) or a scheduler's limit; the findings cover what the log "
                "holds")
    if end.status == EndStatus.INTERRUPTED:
        return (f"it was interrupted by {_signal(end)}", "interrupted",
                "the findings cover the steps it ran; trace a run to its end to check it whole")
    return None


def _signal(end: End) -> str:
    if end.error and end.error.get("type") == "KeyboardInterrupt":
        return "Ctrl-C (SIGINT)"
    if isinstance(end.exit_code, int) and end.exit_code < 0:
        try:
            return signal.Signals(-end.exit_code).name
        except ValueError:
            return f"signal {-end.exit_code}"
    return "a signal"


def _maybe_later(c: Collected, done: int) -> str:
    """Where the log has no end record and the steps after ``done`` were not recorded (a long
    run watched past ``--steps``): the run may have gone further."""
    if c.end is not None:
        return ""
    # absent: every step recorded; a selection this hooktrace cannot read: say what may be
    if done + 1 in TraceOptions.from_header(c.header).steps:
        return ""
    return f" or later (steps after {done} were not recorded in full: --steps)"


def _ran(c: Collected) -> bool:
    """Whether any model ran (an event in the log, or a backward pass completed)."""
    return c.events > 0 or bool(c.end and c.end.steps)


def _all_frozen(c: Collected, model: int) -> bool:
    params = [m for m in c.modules.values() if m.model == model and m.params]
    return bool(params) and not any(m.trainable for m in params)


def _last_model(c: Collected) -> str:
    called = [m for m in c.modules.values() if m.calls and m.first_seq is not None]
    if not called:
        return c.model_name(min(c.models)) if c.models else ""
    return c.model_name(max(called, key=lambda m: m.first_seq or 0).model)


def check_unseen(c: Collected) -> list[Finding]:
    end = c.end
    options = TraceOptions.from_header(c.header)
    # watched steps judged the modules they saw; compiled code run in none but watched steps
    # was never seen (its steps are counted at backward()'s return, judged by nothing)
    followed = end is not None and end.steps and not end.compiled and not options.filtered
    if end is None or c.events or followed or end.status == EndStatus.INTERRUPTED or (
            end.status == EndStatus.ERROR and (end.error or {}).get("type", "SystemExit")
            != "SystemExit"):  # a crash: check_crash says it
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

"""The script stopped on an error: where it was raised and what it usually means.

A backward pass that raised (autograd's "modified by an inplace operation") is named by the
module whose backward was running; any other error by the module whose call raised it and the
line of the user's code, as the end record keeps them. A run that crashed is never "no
problems found". Pure: a ``Collected`` in, findings out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.findings import ERROR, Finding

if TYPE_CHECKING:
    from hooktrace.collected import Collected

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


def check_crash(c: Collected) -> list[Finding]:
    if c.end is None or c.end.status != "error" or not c.end.error:
        return []
    error = c.end.error
    kind = str(error.get("type", "error"))
    if kind in _NOT_A_CRASH:
        return []
    text = str(error.get("message", "")).split(". Hint:")[0]
    where = f" ({error['file']}:{error['line']})" if error.get("file") else ""
    evidence: dict[str, Any] = {"error": kind}
    if where:
        evidence["line"] = f"{error['file']}:{error['line']}"
    if c.unfinished is not None:
        step, (model, name) = c.unfinished
        return [Finding(
            "backward-error", ERROR, c.model_name(model), name, step,
            f"the backward pass of step {step} raised {kind} while the backward of "
            f"{c.label(model, name)} ran{where}: {text[:300]}", evidence,
            _hint(text, "the gradient of the modules before it was never computed: fix this "
                        "error first"))]
    step = c.end.steps
    raised_in, fqn = error.get("model"), error.get("module")
    if isinstance(raised_in, int) and isinstance(fqn, str):
        return [Finding(
            "forward-error", ERROR, c.model_name(raised_in), fqn, step,
            f"the script stopped at step {step}: {c.label(raised_in, fqn)} raised {kind} in its "
            f"forward{where}: {text[:300]}", evidence,
            _hint(text, "the modules after it in forward never ran: fix this error first"))]
    frozen = [c.model_name(m) for m in sorted(c.models) if _all_frozen(c, m)]
    about = (f"; every parameter of model '{frozen[0]}' is frozen (requires_grad=False)"
             if frozen else "")
    return [Finding(
        "script-error", ERROR, frozen[0] if frozen else _last_model(c), "", step,
        f"the script stopped at step {step} with {kind}{where}: {text[:300]}{about}", evidence,
        _hint(text, "the run did not finish: fix this error first"))]


def _all_frozen(c: Collected, model: int) -> bool:
    params = [m for m in c.modules.values() if m.model == model and m.params]
    return bool(params) and not any(m.trainable for m in params)


def _last_model(c: Collected) -> str:
    called = [m for m in c.modules.values() if m.calls and m.first_seq is not None]
    if not called:
        return c.model_name(min(c.models)) if c.models else ""
    return c.model_name(max(called, key=lambda m: m.first_seq or 0).model)

"""What ``check`` reports: a finding, its severities, the thresholds, and their wording helpers.

Shared by the checks (``checks``, ``flow``), the printer (``report``) and the DOT renderer (the
thresholds); it imports nothing of the project, so that each of them starts fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final

from hooktrace.log.words import fqn_text

# one word for the least severity, in the report's headings and in --json alike
ERROR, WARNING, NOTE = "error", "warning", "note"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, NOTE: 2}


@dataclass(frozen=True)
class Thresholds:
    vanishing: float = 1e-7  # a parameter-gradient norm below this (but not 0 by design)
    exploding: float = 1e4  # a parameter-gradient norm above this
    orders: float = 4.0  # activation-gradient norms across the network differing by this many
    gain: float = 1e-6  # a module passing back at most this fraction of the gradient it gets
    # a saturating activation passing back at most this: no layer scale (ConvNeXt's is 1e-6),
    # its branch starves even with a shortcut around it
    saturated: float = 1e-9


class FindingKind:
    """The finding kinds spelled once here: those that are also a log record's kind word (the
    signal or anomaly a finding reports gives it its word; check's own word all the same, so
    that the log's kinds, ``SignalKind`` and ``AnomalyKind``, are spelled only in ``log/``), and
    those more than one module of check names. Every other kind is spelled where its finding
    is made; docs/findings.md lists them all."""

    BACKWARD_HOOK: Final[str] = "backward-hook"
    COMPILED_EAGER: Final[str] = "compiled-eager"
    EVAL_BACKWARD: Final[str] = "eval-backward"
    FROZEN_BN_TRAINING: Final[str] = "frozen-bn-training"
    FUNCTION_BACKWARD: Final[str] = "function-backward"
    GRADS_CARRIED_OVER: Final[str] = "grads-carried-over"
    GRADS_CLEARED: Final[str] = "grads-cleared"
    GRADS_ZEROED: Final[str] = "grads-zeroed"
    HOOKS_GROWING: Final[str] = "hooks-growing"
    LOSS_SHARE: Final[str] = "loss-share"
    LOSS_TARGET_GRAD: Final[str] = "loss-target-grad"
    LOSS_TERM_CUT: Final[str] = "loss-term-cut"
    LR_COLLAPSED: Final[str] = "lr-collapsed"
    NO_GRAD: Final[str] = "no-grad"
    NONFINITE_BACKWARD: Final[str] = "nonfinite-backward"
    NONFINITE_FORWARD: Final[str] = "nonfinite-forward"
    NOT_OPTIMIZED: Final[str] = "not-optimized"
    PARAMS_RECREATED: Final[str] = "params-recreated"
    PROBE: Final[str] = "probe"
    SCALED_STEP: Final[str] = "scaled-step"
    SHARED_STORAGE: Final[str] = "shared-storage"
    STEP_UNEXPLAINED: Final[str] = "step-unexplained"
    STEPPED_TWICE: Final[str] = "stepped-twice"
    UPDATES_ROUNDED: Final[str] = "updates-rounded"
    WEIGHT_DECAY: Final[str] = "weight-decay"
    WEIGHTS_UNCHANGED: Final[str] = "weights-unchanged"
    # spelled in more than one module of check
    BACKWARD_ERROR: Final[str] = "backward-error"
    NO_GRAD_UNDER_NO_GRAD: Final[str] = "no-grad-under-no_grad"
    NOTHING_TRACED: Final[str] = "nothing-traced"
    RANK_DIVERGENCE: Final[str] = "rank-divergence"
    ZERO_GRADIENT: Final[str] = "zero-gradient"


# The invariants check holds, each a finding kind, and the causes that break each: every
# finding names its cause (today's word for what went wrong), and its kind follows from it.
# One table: docs/findings.md lists each kind with its causes (a test holds it).
KINDS: Final[dict[str, tuple[str, ...]]] = {
    # gradients reach every module the loss depends on, as the loss's derivative says
    "gradient-flow": (
        "no-grad", "no-grad-under-no_grad", "zero-gradient", "dead-activation", "saturated",
        "not-a-parameter", "never-reached", "backward-hook", "ignores-grad",
        "function-backward", "hooks-growing"),
    # the gradients that do reach stay within a usable range
    "gradient-scale": ("vanishing", "exploding"),
    # every trainable parameter moves as its gradient, lr and optimizer explain
    "update": (
        "not-optimized", "set-on-wrapper", "shared-storage", "stepped-twice", "frozen",
        "frozen-during-run", "lr-collapsed", "group-lr", "weight-decay", "updates-rounded",
        "step-unexplained", "grads-cleared", "grads-zeroed", "grads-carried-over",
        "params-recreated", "weights-unchanged", "scaled-step", "scaled-twice",
        "clip-before-unscale"),
    # every loss term reaches a trainable parameter and reads what the loss expects; the loss
    # does not diverge
    "loss": (
        "loss-input", "loss-broadcast", "loss-term-cut", "loss-target-grad", "loss-share",
        "loss-reads-nothing", "loss-mask-index", "loss-diverged", "loss-dropped"),
    # the first NaN/Inf, and where it came from
    "nonfinite": ("nonfinite-forward", "nonfinite-backward"),
    # how the models of a run relate: copies, targets, modes
    "models": (
        "evaluation-copy", "shared-target", "weights-replaced", "copied-every-step",
        "copy-not-updated", "eval-backward", "frozen-bn-training"),
    # who may see whom (run --probe)
    "leak": ("samples-mixed", "sees-later", "sees-padding", "probe"),
    # how a model's modules are called
    "calls": ("unused", "called-several-times", "backward-order"),
    # runs that crashed, stopped, were not seen, or whose ranks part ways
    "run": (
        "backward-error", "forward-error", "script-error", "stopped", "nothing-traced",
        "compiled-eager", "rank-divergence"),
}
KIND_OF_CAUSE: Final[dict[str, str]] = {
    cause: kind for kind, causes in KINDS.items() for cause in causes}


@dataclass(frozen=True)
class Finding:
    cause: str  # what went wrong; ``KINDS`` gives its kind
    severity: str
    model: str
    module: str  # the module where it happens (the boundary), not the modules it starves
    step: int | None
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    hint: str = ""
    ranks: list[int] | None = None  # with several logs: the ranks it was found on
    source: str | None = None  # "file:line" of its module's class's forward, when known

    def __post_init__(self) -> None:
        if self.cause not in KIND_OF_CAUSE:
            raise ValueError(f"a finding's cause {self.cause!r} is in no kind of KINDS")

    @property
    def kind(self) -> str:
        """The invariant this finding breaks (``KINDS``)."""
        return KIND_OF_CAUSE[self.cause]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass
class Report:
    """What ``check`` found in a run's logs, with what it read."""
    findings: list[Finding]
    warnings: list[str]
    steps: int
    events: int
    captured: str | None = None  # the --capture folder and its file count, when there is one
    # with two models or more: what each was over the steps (``models.ModelFacts``), no finding
    models: list[Any] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != NOTE]


def steps_text(steps: list[int]) -> str:
    """``step 3``, ``steps 0, 1, 2``, ``steps 0, 1, 2, 3, 4 and 7 more``."""
    shown = ", ".join(map(str, steps[:5]))
    more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
    return ("step " if len(steps) == 1 else "steps ") + shown + more


def names_text(names: list[str], keep: int = 6) -> str:
    """``a, b, c`` or ``a, b, c, ... and 4 more``, ``(root)`` for the root."""
    shown = ", ".join(fqn_text(n) for n in names[:keep])
    return shown + (f" and {len(names) - keep} more" if len(names) > keep else "")

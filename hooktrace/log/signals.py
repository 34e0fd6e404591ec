"""The ``signal`` record: what the training loop did around the modules; its kinds, spelled once
(``SignalKind``) and each documented (``Signal``).

Part of the log contract (``schema`` re-exports it): standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from hooktrace.log.fields import LogFact


class SignalKind:
    """Each kind of ``signal`` record, spelled once: the word on the wire, which every writer
    and reader names through these constants (``Signal``'s docstring says what each means).
    Plain strings, not an Enum: the log stays as it is, and a reader keeps a kind it does not
    know (a newer log's) as the word it read."""

    EVAL_BACKWARD: Final[str] = "eval-backward"
    OPTIMIZERS: Final[str] = "optimizers"
    SHARED_STORAGE: Final[str] = "shared-storage"
    GRADS_CARRIED_OVER: Final[str] = "grads-carried-over"
    BACKWARD_HOOK: Final[str] = "backward-hook"
    FROZEN_BN_TRAINING: Final[str] = "frozen-bn-training"
    GRADS_CLEARED: Final[str] = "grads-cleared"
    PARAMS_WITHOUT_GRAD: Final[str] = "params-without-grad"
    GRADS_ZEROED: Final[str] = "grads-zeroed"
    PARAMS_RECREATED: Final[str] = "params-recreated"
    TRAINABLE_CHANGED: Final[str] = "trainable-changed"
    LOSS_SCALE: Final[str] = "loss-scale"
    NONFINITE_WEIGHTS: Final[str] = "nonfinite-weights"
    HALF_UPDATES: Final[str] = "half-updates"
    GRAD_ZEROS: Final[str] = "grad-zeros"
    LOSS_OPS: Final[str] = "loss-ops"
    LOSS_SCALED: Final[str] = "loss-scaled"
    SCALED_STEP: Final[str] = "scaled-step"
    SCALED_CLIP: Final[str] = "scaled-clip"
    COMPILED_EAGER: Final[str] = "compiled-eager"
    OPTIMIZER_STEPS: Final[str] = "optimizer-steps"
    HOOKS_GROWING: Final[str] = "hooks-growing"
    FUNCTION_BACKWARD: Final[str] = "function-backward"
    STEP_SAMPLE: Final[str] = "step-sample"
    PROBE: Final[str] = "probe"
    LOSS_TERM_CUT: Final[str] = "loss-term-cut"
    LOSS_SHARE: Final[str] = "loss-share"
    LOSS_TARGET_GRAD: Final[str] = "loss-target-grad"
    TWINS: Final[str] = "twins"
    NONFINITE_INPUTS: Final[str] = "nonfinite-inputs"
    LOSS_VALUES: Final[str] = "loss-values"
    PARAMS_UNMOVED: Final[str] = "params-unmoved"
    OPTIMIZER_LRS: Final[str] = "optimizer-lrs"
    CALL_TIMES: Final[str] = "call-times"


def kinds_of(namespace: type) -> tuple[str, ...]:
    """The words a namespace of kinds (``SignalKind``) defines, in the order it defines them."""
    return tuple(v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str))


@dataclass(slots=True)
class Observed(LogFact):
    """What ``signal`` and ``anomaly`` records both say: what (``kind``), of which module, when."""

    step: int
    model: int
    fqn: str
    kind: str


@dataclass(slots=True)
class Signal(Observed):
    """What the training loop did around a model, written when it is first seen or changes
    (recorded and watched steps alike), at the step it happened in. ``kind`` is one of
    ``KINDS``; what each kind means, when it is written and the keys of its ``detail`` are the
    table in ``docs/schema.md`` (Signals), the one home of the contract (a test holds every kind
    there). ``fqn`` is the module a signal is about (``""``: the model's root); on the wire
    ``"name"``.
    """

    TYPE: ClassVar[str] = "signal"
    KINDS: ClassVar[tuple[str, ...]] = kinds_of(SignalKind)
    detail: dict[str, Any] = field(default_factory=dict)


#: autograd ops (node names without ``Backward<n>``) that only view, reshape, copy or cast a
#: tensor: in a ``loss-ops`` signal, what lies between ops that compute
VIEW_OPS = frozenset({"View", "UnsafeView", "Reshape", "ReshapeAlias", "Alias", "Expand",
                      "Squeeze", "Unsqueeze", "Transpose", "Permute", "T", "ToCopy", "Clone",
                      "Contiguous"})

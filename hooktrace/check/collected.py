"""What the checks need from a log: the per-module and per-step aggregates ``collect`` fills.
Standard library only: ``hooktrace check`` runs without torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hooktrace.check.calls import JudgedCall
from hooktrace.check.keys import ModelFqn, ModelFqns
from hooktrace.log import schema
from hooktrace.log.names import LogNames
from hooktrace.log.schema import SignalKind
from hooktrace.log.words import fqn_text


@dataclass
class ModuleStats:
    model: int
    fqn: str
    cls: str
    params: int = 0
    trainable: int = 0
    first_seq: int | None = None  # first forward call: execution order
    calls: int = 0
    max_calls_per_step: int = 0  # with gradient recording on
    loose: tuple[str, ...] = ()  # tensors meant to train that are not parameters (schema.Module)
    drop: tuple[float, str] | None = None  # a random-drop layer's p and unit (schema.Module)
    wrapper: str | None = None  # held by a wrapper beside the model it wraps (schema.Module)
    aliases: tuple[str, ...] = ()  # its other fqns: registered in several places (schema.Module)
    alias_of: str | None = None  # a second path to a module under another parent (schema.Module)


@dataclass
class LossCall:
    """The first call of a loss module (``losses.LOSSES``): its tensor inputs' shapes, and the
    module whose output it took, where the call before it was that module's model's root and
    the one before that its last module (``model(x)`` then ``criterion``)."""

    step: int
    shapes: list[Any]
    after: ModelFqn | None  # the model's last module


@dataclass
class Nonfinite:
    step: int
    model: int
    fqn: str
    evidence: dict[str, Any]


@dataclass
class NonfiniteSeen:
    """Where NaN/Inf appeared in forward outputs, or in gradients: the run's first (nonfinite's
    one rule), the steps with any, and per step the module of its first (backward: with whether
    it produced it): a zoomed call of a later step answers for a NaN/Inf finding only where they
    are its own."""

    first: Nonfinite | None = None
    steps: set[int] = field(default_factory=set)
    of_step: dict[int, Any] = field(default_factory=dict)


@dataclass
class Collected:
    """What the checks need from a log, gathered in one streaming pass."""

    header: schema.Header
    # each model's name, each module's class, where each class's forward is: the log's names
    names: LogNames = field(default_factory=LogNames)
    modules: dict[ModelFqn, ModuleStats] = field(default_factory=dict)
    backward_steps: set[int] = field(default_factory=set)
    # per step: the modules it called with gradient recording on, and under no_grad; per step
    # of a forward call, the modules whose calls of that step got a backward
    grad: dict[int, ModelFqns] = field(default_factory=dict)
    no_grad: dict[int, ModelFqns] = field(default_factory=dict)
    backward: dict[int, ModelFqns] = field(default_factory=dict)
    # per step: the modules whose calls with gradient recording on all ran in eval mode (a
    # validation pass after model.eval(), or training in eval mode: the backward tells)
    eval_mode: dict[int, ModelFqns] = field(default_factory=dict)
    forward_nan: NonfiniteSeen = field(default_factory=NonfiniteSeen)
    backward_nan: NonfiniteSeen = field(default_factory=NonfiniteSeen)
    # per step: (model, fqns, parameter-gradient norms) of each params record, in file order; the
    # fqns are a tuple shared by the records of the same modules
    param_norms: dict[int, list[tuple[int, tuple[str, ...], tuple[float | None, ...]]]] = field(
        default_factory=dict)
    # per step: activation-gradient norms (grad_output) of modules with parameters, in backward
    # order, as (modules, norms): tuples, the first shared by the steps with the same modules
    profiles: dict[int, tuple[tuple[ModelFqn, ...], tuple[float, ...]]] = field(
        default_factory=dict)
    # the first step whose backward does not run the calls in the reverse of their forward
    # order: (step, model, fqn of the first call out of place)
    order_mismatch: tuple[int, int, str] | None = None
    steps_seen: set[int] = field(default_factory=set)
    lost_gradient: dict[ModelFqn, list[int]] = field(default_factory=dict)  # watched
    # the first watched no-grad anomaly's detail per module: the step it last got a gradient
    # in (``last``), the most steps it went without one before (``gap``)
    lost_detail: dict[ModelFqn, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    end: schema.End | None = None
    events: int = 0  # forward and backward events read, of every step
    last_step: int | None = None  # the last step with a step record: its backward pass ended
    # the calls of the first recorded steps, each with its backward's gradient norms
    calls: list[JudgedCall] = field(default_factory=list)
    # a backward pass that never ended (it raised): its step, and the module of its last
    # backward event, whose backward was running
    unfinished: tuple[int, ModelFqn] | None = None
    signals: list[schema.Signal] = field(default_factory=list)  # in file order
    losses: dict[ModelFqn, LossCall] = field(default_factory=dict)
    # per module, its first zoomed calls' operations (``ops`` records, ``ops.KEEP`` at most)
    ops: dict[ModelFqn, list[schema.Ops]] = field(default_factory=dict)
    # the call that returned just before the run's first NaN/Inf forward output, in its step
    # (None: none did): where a NaN/Inf that came in through its inputs was made after
    forward_first_before: ModelFqn | None = None
    log: str = ""  # the log's path, as given

    @property
    def models(self) -> dict[int, str]:
        return self.names.models

    @property
    def sources(self) -> dict[str, str]:
        """class -> "file:line" of its forward"""
        return self.names.sources

    def model_name(self, model: int) -> str:
        return self.models.get(model, str(model))

    def unscale(self) -> None:
        """Parameter-gradient norms divided by the loss scale in force at their step (the
        ``loss-scale`` signals): a backward pass leaves gradients scaled until the scaler's
        step unscales them."""
        changes = sorted((s.step, s.model, float(s.detail.get("scale") or 1.0))
                         for s in self.signals if s.kind == SignalKind.LOSS_SCALE)
        if not changes:
            return
        for step, records in self.param_norms.items():
            for i, (model, names, norms) in enumerate(records):
                scale = next((x for s, m, x in reversed(changes) if s <= step and m == model),
                             1.0)
                if scale != 1.0:
                    records[i] = (model, names, tuple(None if n is None else n / scale
                                                      for n in norms))

    def backward_models(self) -> set[int]:
        """The models a backward pass reached, in some recorded step."""
        return {key[0] for keys in self.backward.values() for key in keys}

    def data_models(self) -> set[int]:
        """The models that prepare data (``LogNames.data_models``), of the whole log: of the
        models with modules, those without parameters that no backward pass reached."""
        return self.names.data_models({m.model for m in self.modules.values()},
                                      self.backward_models())

    def zero_loss_steps(self) -> set[int]:
        """The steps whose backward pass started from a loss of exactly 0 (the loss ledger's
        ``loss-values``): a hinge or a margin already met, every gradient zero by the loss
        itself: nothing to judge of the modules it passes through."""
        return {step for s in self.signals if s.kind == SignalKind.LOSS_VALUES
                for step, value in zip(s.detail.get("steps") or (), s.detail.get("values") or (),
                                       strict=False) if value == 0}

    def first_seq(self, model: int, name: str) -> int:
        """Where a module first ran, in forward order (0: never, or unknown)."""
        m = self.modules.get((model, name))
        return m.first_seq or 0 if m is not None else 0

    def label(self, model: int, name: str) -> str:
        """A module as findings name it: ``layer1.0 (BasicBlock)``, ``(root)`` for the root."""
        m = self.modules.get((model, name))
        return f"{fqn_text(name)} ({m.cls})" if m and m.cls != "?" else fqn_text(name)

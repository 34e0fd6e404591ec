"""The immutable records the tracer core hands to its observers, and the observer interface.

A record is a ``NamedTuple``: made once, never changed (no observer can alter what another one
sees). An observer keys what it keeps about a call by its records (``ForwardStart`` and
``BackwardStart`` hash by identity, ``ForwardCall`` by value: an equal record is the same
call). ``core.py``
documents when each observer method is called.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hooktrace.hooks.dataflow import Outs, Producers, Sources
    from hooktrace.hooks.naming import ModInfo
    from hooktrace.hooks.tensors import Summary
    from hooktrace.log.options import TraceOptions

#: what an observer hands each record it writes to: the recorder's ``emit``
Emit = Callable[[Any], None]


class Mode(enum.IntEnum):
    """What a step is: ``step_mode`` decides, once per step (and when the log is full)."""

    OFF = 0  # no module call is followed
    WATCHED = 1  # calls followed and checked, no event written
    RECORDED = 2  # every call becomes forward and backward events


def step_mode(step: int, options: TraceOptions, log_full: bool) -> Mode:
    """What ``step`` is: recorded (in ``--steps``, while the log takes events), else watched
    (``--watch`` with statistics), else off."""
    if step in options.steps and not log_full:
        return Mode.RECORDED
    return Mode.WATCHED if options.watch and options.stats else Mode.OFF


class _ForwardStart(NamedTuple):
    module: nn.Module
    info: ModInfo
    step: int
    mode: Mode
    grad: bool  # gradient recording on
    #: tensor leaves of the positional arguments; empty in a watched step (unless each call's
    #: backward is followed there: --break-on nan)
    inputs: list[torch.Tensor]
    inputs_more: int  # leaves past the ones listed (huge containers): counted, not listed
    #: shapes and dtypes of ``inputs`` as the call began (an in-place op may change them);
    #: recorded steps only, empty otherwise
    input_summary: Summary
    #: the version counters of ``inputs`` as the call began (recorded steps with gradients on):
    #: an input the call changes in place has a new one
    input_versions: tuple[int, ...]
    #: which calls made ``inputs`` (``dataflow``): recorded steps only
    sources: Sources | None = None
    #: the module's ``training`` flag as the call began (recorded steps only: True elsewhere)
    training: bool = True


class ForwardStart(_ForwardStart):
    """A traced module's forward begins (a recorded or watched step). Lives while it runs."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class ForwardCall(NamedTuple):
    """A module call that returned: what its backward refers to. Kept as long as the autograd
    graph that holds its gradient hooks."""

    seq: int  # the forward event's seq; -1 when the call was not recorded
    step: int
    info: ModInfo
    call_index: int  # calls of this module (or of its recomputations) in this step before it
    recompute: bool  # re-run inside backward by activation checkpointing
    n_in: int  # tensor leaves of args then kwargs
    n_out: int  # tensor leaves of the output


class ForwardEnd(NamedTuple):
    """A traced module's forward returned. Handed on inside the forward hook, then dropped."""

    start: ForwardStart
    call: ForwardCall
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    kw_inputs: list[torch.Tensor]  # tensor leaves of the keyword arguments (as ``inputs``)
    kw_inputs_more: int
    outputs: list[torch.Tensor]  # tensor leaves of the output
    outputs_more: int
    mode: Mode  # the step's mode when the call returned
    in_backward: bool  # a backward pass is running (checkpointing recomputes inside it)
    top: bool  # a model call: no other module call is running in its thread
    #: recorded steps: per input (args then kwargs) the seqs of the calls whose outputs made
    #: it, and, for a call with calls inside, those of the calls that made its outputs
    inputs_from: tuple[Producers, ...] | None = None
    made: Producers = ()
    from_out: tuple[Outs, ...] = ()  # per input, which output of each producer it used
    made_out: tuple[Producers, ...] = ()  # per output, the calls that made it (several)
    #: something without autograd history went into its outputs: ``made`` may miss a call
    made_no_history: bool = False


class _BackwardStart(NamedTuple):
    call: ForwardCall
    seq: int  # the backward event's seq; 0 in a watched step
    step: int
    mode: Mode


class BackwardStart(_BackwardStart):
    """The first gradient of a pass reached one of a call's outputs: its backward began. The
    call's gradients follow, each with this record."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class PassEnd(NamedTuple):
    """A backward pass ended: step ``step`` is over (``mode``: what it was at its end)."""

    step: int
    mode: Mode
    #: the traced modules whose forward returned in the step (recorded or watched), each once,
    #: in the order they first did: what an observer would otherwise learn from a call per
    #: module (``forward_end``)
    called: tuple[ModInfo, ...]
    #: the modules whose backward began in this pass, each once, in that order (in a watched
    #: step, model calls only)
    reached: tuple[ModInfo, ...]


class OptimizerStep(NamedTuple):
    """An optimizer's ``step()`` begins or ended (``hooks/stepping.py``): the optimizer and
    the arguments the program gave it (``args[0]`` is the optimizer; a closure among them)."""

    optimizer: torch.optim.Optimizer
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Observer:
    """Receives the core's records. Every method is optional: the core calls only the ones a
    subclass overrides. Observers keep their own state, keyed by the records.

    To add one (say, a diagnosis signal: a model's ``.training`` at ``model_call``, a module's
    source at ``module_seen``, gradients left over at ``backward_end``): subclass, override what
    it needs, set ``follows``, and add it in ``tracer.py``, before the log writer if it emits.
    An observer that writes records of its own is handed the log writer's ``emit``
    (``recorder.py``): what it emits lands after the step's events and before the step record.
    The optimizer's steps come through ``optimizer_stepping`` and ``optimizer_stepped`` (one
    registration, the core's); another hook it needs it registers itself and removes in
    ``stop``."""

    #: the modes whose calls it is handed (forward_start, forward_end, backward_start,
    #: grad_output, grad_input); the other methods are called in every mode
    follows: ClassVar[tuple[Mode, ...]] = (Mode.WATCHED, Mode.RECORDED)

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        """A module called for the first time (traced or filtered out: ``info.traced``)."""

    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        """A top-level call begins: no module call is running in this thread."""

    def forward_start(self, start: ForwardStart) -> None:
        """A traced module call begins in a recorded or watched step."""

    def forward_end(self, end: ForwardEnd) -> None:
        """It returned (not when it raised; not when ``--max-events`` refused it)."""

    def backward_start(self, start: BackwardStart) -> None:
        """Its backward began in this pass."""

    def grad_output(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        """The gradient reaching the call's output ``index``."""

    def grad_input(self, start: BackwardStart, index: int, grad: torch.Tensor) -> None:
        """The gradient of the call's input ``index`` (args then kwargs)."""

    def backward_end(self, end: PassEnd) -> None:
        """The pass ended; the step is over. What an observer emits here precedes the step
        record (the log writer comes after the observers that emit)."""

    def optimizer_stepping(self, step: OptimizerStep) -> None:
        """An optimizer's ``step()`` begins (every step, whatever the mode; an exception here
        makes the core hand this observer no more of them)."""

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        """It returned."""

    def stop(self, step: int, mode: Mode) -> None:
        """Tracing stops (hooks already removed) in ``step``, which did not end."""


def wanting(observers: Sequence[Observer], name: str) -> list[Callable[..., None]]:
    """The bound ``name`` methods of the observers that override it."""
    return [getattr(o, name) for o in observers
            if getattr(type(o), name) is not getattr(Observer, name)]


def per_mode(observers: Sequence[Observer], name: str) -> list[list[Callable[..., None]]]:
    """``wanting`` for each mode (a list indexed by it): the observers that follow its calls."""
    return [wanting([o for o in observers if mode in o.follows], name) for mode in Mode]

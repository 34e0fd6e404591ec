"""The log contract: every record of a hooktrace log, defined once.

A log is JSON Lines, UTF-8, one record per line, each with a ``"type"`` key:

``header``   first line: schema version, versions, argv, pid, rank, filters in force; ``dataflow``
             when forward events say which calls made their inputs (``ForwardEvent``),
             ``made_no_history`` when they say what went into their outputs without history.
``model``    a top-level model seen by the tracer (``model`` index, a name, its class).
``module``   one per named submodule, written once when its model is first seen: its ``id``
             (events refer to it), class, own parameter counts, other names of a shared module;
             for a random-drop layer, ``drop``: its probability ``p`` and what one draw drops,
             ``per`` the whole ``batch``, a ``sample``, a ``channel`` or an ``element``.
``tensors``  a tensor signature, written before the first event that uses its ``id``: the
             shapes of a call's tensor leaves in order, with their dtypes for a forward one (for
             gradients, ``null`` where none flowed).
``forward``  one module call, written when it returns, in execution order.
``backward`` the backward of one call, ordered by when its outputs first received gradient
             (when autograd started its backward); ``in``/``out`` are its gradients' signatures.
``params``   after a backward pass: the gradient norm of each module's own parameters (with
             ``--no-stats``: only of modules never called whose parameters got a gradient).
``anomaly``  in a watched step (outside ``--steps``): a NaN/Inf or a module that lost its gradient.
``signal``   what the training loop did around the modules (a model's train/eval mode, the
             optimizers, gradients left uncleared, a deprecated backward hook), when it changes.
``source``   where a module class's ``forward`` is defined, once per class (not torch's own).
``ops``      the tensor operations of a zoomed call (``--ops``), each with its line (``ops.py``).
``step``     closes a step: written when a backward pass ends.
``end``      last line: ``ok``, ``error`` or ``interrupted``, with counts (events, steps, the
             ``backward()`` calls and the graphs ``torch.compile`` compiled while tracing ran).

Events name modules and tensor signatures by id, which keeps a log near 100 bytes per event; the
reader resolves the ids, so the records it yields carry names and shapes. A record that names a
module (``Module``, ``ForwardEvent``, ``BackwardEvent``, ``Anomaly``, ``Signal``, ``Ops``) holds
its fqn in the field ``fqn``, written under the key ``"name"``; ``Model.name`` is a model's name.

``seq`` is global and increasing in file order. ``step`` counts backward passes: forward calls
before the first backward are step 0, the first backward pass is step 0 too, and the forward
calls after it are step 1. ``call`` numbers the calls of one module within one step.

Readers ignore keys they do not know; a key that is absent takes the default below. This module
imports only the standard library: the renderer and the checker read logs without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Union

from hooktrace.log.errors import SchemaError as SchemaError
from hooktrace.log.fields import OMIT_EMPTY, LogFact, decode, encode, get
from hooktrace.log.gradstat import GradStat as GradStat
from hooktrace.log.ops import Op as Op
from hooktrace.log.ops import Ops as Ops
from hooktrace.log.signals import VIEW_OPS as VIEW_OPS
from hooktrace.log.signals import Observed, kinds_of
from hooktrace.log.signals import Signal as Signal
from hooktrace.log.signals import SignalKind as SignalKind

SCHEMA_VERSION = 3

Shape = Sequence[int]
Record = Union[
    "Header", "Model", "Module", "ForwardEvent", "BackwardEvent", "ParamGrads", "Anomaly", "Step",
    "End", "Signal", "Source", "Ops",
]


@dataclass(slots=True)
class Header(LogFact):
    TYPE: ClassVar[str] = "header"
    NULLS: ClassVar[bool] = True
    schema: int
    hooktrace: str = "?"
    torch: str | None = None
    python: str | None = None
    argv: list[str] = field(default_factory=list)
    pid: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    hostname: str | None = None
    started: float | None = None  # unix time
    #: filters in force: include, exclude, steps, max_events (absent = everything recorded)
    options: dict[str, Any] = field(default_factory=dict)
    #: forward events carry ``inputs_from`` and ``made`` (absent: a log from before them)
    dataflow: bool = False
    #: recorded steps run ``torch.compile``'d code eagerly (``torch.compiler.set_stance
    #: ("force_eager")`` while a step is recorded), so every module hook sees it; the other
    #: steps run it compiled (absent: a log from before)
    eager: bool = False
    #: forward events say ``made_no_history`` (absent: a log from before it, which does not)
    made_no_history: bool = False


@dataclass(slots=True)
class Model(LogFact):
    """A top-level model: a module first called outside any other traced module. One called on
    its own before a model holding it was first called is a model until then (its modules are
    named anew, ``module`` records of that model, from its first call on)."""

    TYPE: ClassVar[str] = "model"
    model: int
    name: str  # the variable it was bound to when first called, else its class name
    cls: str = "?"


class DropUnit:
    """What one draw of a random-drop layer drops (``Module.drop_unit``), spelled once."""

    BATCH: Final[str] = "batch"  # the whole batch (torchvision's ``StochasticDepth(mode="batch")``)
    SAMPLE: Final[str] = "sample"
    CHANNEL: Final[str] = "channel"
    ELEMENT: Final[str] = "element"


@dataclass(slots=True)
class Module(LogFact):
    """One named module of a model; ``params``/``trainable`` count its own (direct) parameters."""

    TYPE: ClassVar[str] = "module"
    model: int
    fqn: str  # its named_modules() name, "" for the root, wrapper prefixes stripped
    cls: str = "?"  # not known: an event's module the tracer had no record of
    params: int = 0
    trainable: int = 0
    aliases: list[str] | None = None  # further fqns of a module registered in several places
    # its own attributes that are leaf tensors with requires_grad=True but not nn.Parameters
    # (``self.scale = torch.ones(1, requires_grad=True)``): model.parameters() never holds them
    loose: list[str] | None = None
    # a layer that drops at random (Dropout, StochasticDepth, DropPath): its drop probability
    # and what one draw drops (``DROP_UNITS``), for telling a whole input dropped by chance
    drop: float | None = None
    drop_unit: str | None = None
    # set on a child that a wrapper (DataParallel, DDP, torch.compile's) holds beside the model
    # it wraps, named ``(Wrapper).child``: the wrapper's class; the wrapper's forward never
    # calls it (``DataParallel(model).fc = ...`` meant for ``model.module.fc``)
    wrapper: str | None = None
    #: a second path to a module registered under two parents (``encoder.block`` is also
    #: ``decoder.block``): this name is the one its calls from that parent are recorded under,
    #: ``alias_of`` the module's first name, which holds its parameters (``params`` 0 here)
    alias_of: str | None = None

    DROP_UNITS: ClassVar[tuple[str, ...]] = kinds_of(DropUnit)

    def to_dict(self) -> dict[str, Any]:
        d = encode(self)
        if "drop" in d:  # one key on the wire: {"p": drop, "per": drop_unit}
            d["drop"] = {"p": self.drop, "per": d.pop("drop_unit", None)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Module:
        drop = get(d, "drop", dict, {})
        p, per = drop.get("p"), drop.get("per")
        known = type(p) in (float, int) and per in cls.DROP_UNITS  # else: none
        return decode(cls, {**d, "drop": float(p) if known else None,
                            "drop_unit": per if known else None})


@dataclass(slots=True)
class CallEvent:
    """What forward and backward events both say: which call of which module, in which step."""

    TYPE: ClassVar[str] = ""
    seq: int
    step: int
    model: int
    fqn: str
    call: int

    @property
    def phase(self) -> str:
        """``forward`` or ``backward``: the record's type."""
        return self.TYPE


@dataclass(slots=True)
class ForwardEvent(CallEvent):
    """One module call, written when it returns. On the wire: ``{"type":"forward", "seq",
    "step", "module": id, "call", "in": id, "out": id}``, ids of module and tensors records."""

    TYPE: ClassVar[str] = "forward"
    # tensor leaves of args then kwargs (tuples as the tracer makes them, lists when read)
    input_shapes: Sequence[Shape] = field(default_factory=list)
    input_dtypes: Sequence[str] = field(default_factory=list)
    output_shapes: Sequence[Shape] = field(default_factory=list)
    output_dtypes: Sequence[str] = field(default_factory=list)
    no_grad: bool = False  # ran with gradient recording off (torch.no_grad, inference_mode)
    recompute: bool = False  # re-run inside backward by activation checkpointing
    inputs_more: int | None = None  # tensor leaves beyond the ones listed (huge containers)
    outputs_more: int | None = None
    #: outputs holding NaN/Inf, as [output index, nan count, inf count]; absent when all finite
    #: (or when statistics are off)
    output_nonfinite: list[list[int]] | None = None
    #: per tensor input (as listed: args then kwargs), the seqs of the calls whose outputs made
    #: it, ascending: the nearest traced calls back through its autograd graph, across
    #: functional ops (``F.relu``, ``torch.cat``, a residual ``+``), or, where it has no
    #: autograd history (``no_grad``, ``.detach()``, integers), the call that returned its
    #: storage; empty where none did (a model input). A call returning another's output
    #: unchanged (a parent its last child's) is the one named. On the wire ``"from"``: per
    #: input the offset back from ``seq`` (``null``: none; a list: several); absent where every
    #: input came from the call just before (``seq - 1``). None: not recorded (``dataflow``)
    inputs_from: Sequence[Sequence[int]] | None = None
    #: for a call with calls inside it: the seqs of the calls whose outputs made its outputs,
    #: found as for its inputs: those inside it, and those before it whose data it passed on
    #: (a residual's skip), what a picture that draws the call as a box of its calls uses in
    #: its place; on the wire ``"made"``, offsets back from ``seq``; absent: none
    made: Sequence[int] | None = None
    #: per tensor input, parallel to ``inputs_from``: which output of each producer it used
    #: (the index among the producer's tensor outputs; -1: several of them, or not known). On
    #: the wire ``"from_out"``, one list per input; absent: every input used output 0 (a log
    #: from before it has no ``made_out`` either, and draws as before)
    from_out: Sequence[Sequence[int]] | None = None
    #: for a call with calls inside it and several tensor outputs: per output, the seqs of the
    #: calls that made that output (``made`` split by output), so that a consumer of one output
    #: is joined to its maker only (an LSTM-like ``(out, (h, c))``); on the wire
    #: ``"made_out"``, offsets back from ``seq``; absent: ``made`` stands for every output
    made_out: Sequence[Sequence[int]] | None = None
    #: the module was in eval mode as the call began (``module.training`` False: after
    #: ``model.eval()``); on the wire ``"eval": true``, absent in train mode
    eval_mode: bool = False
    #: for a call with calls inside it, whose outputs carry autograd history: something
    #: without it went into them on the way back to the calls of ``made`` (an input edge
    #: autograd leaves empty: a ``.detach()``ed result, one made under ``no_grad``, a buffer or
    #: a model input added in; or a floating output without history beside them), or the walk
    #: stopped at its bound: ``made`` may miss a call whose output got no gradient. On the wire
    #: ``"made_no_history": true``; absent: nothing did (in a log whose header says
    #: ``made_no_history``; a log from before it does not say)
    made_no_history: bool = False


@dataclass(slots=True)
class BackwardEvent(CallEvent):
    """Backward of one forward call (``fwd`` is that call's ``seq``). On the wire:
    ``{"type":"backward", "seq", "step", "module", "call", "fwd", "in": id, "out": id}`` plus
    ``in_stats``/``out_stats`` when statistics are on.

    ``grad_output_shapes[i]`` is the gradient reaching the i-th tensor output,
    ``grad_input_shapes[i]`` the gradient of the i-th tensor input (``None`` where none flowed).
    Lengths count tensor leaves of the flattened outputs/inputs, kwargs included; for a module
    whose inputs and outputs are plain tensors this equals what ``register_full_backward_hook``
    reports. ``grad_input`` is the input tensor's *total* gradient: where an input also feeds
    another branch (a residual), it includes that branch's share.
    """

    TYPE: ClassVar[str] = "backward"
    fwd: int
    grad_input_len: int = 0
    grad_output_len: int = 0
    grad_input_shapes: list[Shape | None] = field(default_factory=list)
    grad_output_shapes: list[Shape | None] = field(default_factory=list)
    recompute: bool = False
    #: per gradient, like the shapes: [norm, absmax(, nan, inf)] or None; absent with --no-stats
    grad_input_stats: list[GradStat | None] | None = None
    grad_output_stats: list[GradStat | None] | None = None
    #: inputs that needed a gradient (required grad when the call ran) and got none by the end
    #: of the backward pass: the gradient stopped inside the call; absent when none
    lost: list[int] | None = None


@dataclass(slots=True)
class ParamGrads:
    """After backward pass ``step``: per module with trainable parameters that took part in the
    step, the norm of its own parameters' ``.grad`` (None: no parameter had a gradient); and per
    module never called so far whose parameters got a gradient anyway (its parent uses them,
    as MultiheadAttention its out_proj's), their norm. Without statistics, only the latter.
    Keyed by fqn here, by module id (as a string: a JSON key) on the wire."""

    TYPE: ClassVar[str] = "params"
    step: int
    model: int
    grad_norm: dict[str, float | None] = field(default_factory=dict)


class AnomalyKind:
    """Each kind of ``anomaly`` record, spelled once (``Anomaly`` says what each means); plain
    strings, as ``SignalKind``'s."""

    NONFINITE_FORWARD: Final[str] = "nonfinite-forward"
    NONFINITE_BACKWARD: Final[str] = "nonfinite-backward"
    NO_GRAD: Final[str] = "no-grad"


@dataclass(slots=True)
class Anomaly(Observed):
    """In a watched step (outside ``--steps``, where events are not written): the first module
    whose forward output held NaN/Inf (``nonfinite-forward``; ``detail.weights``: its own
    parameters that held NaN/Inf too, where any did, ``detail.weights_dtypes`` their dtypes),
    the first whose backward produced or received a NaN/Inf gradient (``nonfinite-backward``),
    or a module that received gradient before and no longer does (``no-grad``)."""

    TYPE: ClassVar[str] = "anomaly"
    KINDS: ClassVar[tuple[str, ...]] = kinds_of(AnomalyKind)
    call: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Source(LogFact):
    """Where the ``forward`` of a module class is defined: ``file`` (relative to the working
    directory when under it) and ``line``. Once per class; torch's own classes have none."""

    TYPE: ClassVar[str] = "source"
    cls: str
    file: str
    line: int


@dataclass(slots=True)
class Step(LogFact):
    """Written when backward pass ``step`` ends; counts the events recorded in that step."""

    TYPE: ClassVar[str] = "step"
    step: int
    forward: int = 0
    backward: int = 0


class EndStatus:
    """How a run ended, the ``end`` record's ``status``, spelled once."""

    OK: Final[str] = "ok"
    ERROR: Final[str] = "error"
    INTERRUPTED: Final[str] = "interrupted"


END_STATUSES = kinds_of(EndStatus)


@dataclass(slots=True)
class End(LogFact):
    TYPE: ClassVar[str] = "end"
    status: str = field(metadata={"one_of": END_STATUSES})  # an ``EndStatus``
    events: int = 0
    steps: int = 0  # backward passes completed
    exit_code: int | None = None
    # {"type", "message"}; where known, the module whose call raised it ("model": its id,
    # "module": its fqn) and the innermost line of the user's code ("file", "line")
    error: dict[str, Any] | None = None
    dropped: int | None = None  # events not written because --max-events was reached (while
    # hooks stayed on: with --no-watch they are removed after the last selected step)
    tracer_error: str | None = None  # the tracer failed and stopped; the script went on
    captured: int | None = None  # files written by --capture into <log>.capture/
    #: backward() calls while tracing ran (absent: none, or older)
    backward: int | None = field(default=None, metadata=OMIT_EMPTY)
    #: graphs torch.compile compiled while tracing ran (absent: none)
    compiled: int | None = field(default=None, metadata=OMIT_EMPTY)


RECORDS: dict[str, type[LogFact]] = {r.TYPE: r for r in (Header, Model, Module, Anomaly, Signal,
                                                     Source, Ops, Step, End)}


def from_dict(d: Any) -> Record | None:
    """The record of one parsed line that is not an event; ``None`` for a record type this
    version does not know, or a ``kind`` not among its ``KINDS`` (a newer version's). Raises
    SchemaError when a known record lacks a key or holds a value of the wrong type."""
    if not isinstance(d, dict):
        raise SchemaError(f"a record must be a JSON object, not {type(d).__name__}")
    cls: Any = RECORDS.get(get(d, "type", str))
    if cls is None or (issubclass(cls, Observed) and get(d, "kind", str) not in cls.KINDS):
        return None
    return cls.from_dict(d)  # type: ignore[no-any-return]

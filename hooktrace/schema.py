"""The log contract: every record of a hooktrace log, defined once.

A log is JSON Lines, UTF-8, one record per line, each with a ``"type"`` key:

``header``  first line: schema version, versions, argv, pid, rank, filters in force.
``model``   a top-level model seen by the tracer (``model`` index, a name, its class).
``module``  one per named submodule, written once when its model is first seen:
            class, own parameter counts, other names of a shared module.
``event``   one module call: ``phase`` is ``"forward"`` (written when the call returns, in
            execution order) or ``"backward"`` (ordered by when its outputs first received
            gradient, i.e. when autograd started its backward).
``params``  after a backward pass: the gradient norm of each module's own parameters.
``anomaly`` in a watched step (outside ``--steps``): a NaN/Inf or a module that lost its gradient.
``step``    closes a step: written when a backward pass ends.
``end``     last line: ``ok``, ``error`` or ``interrupted``, with counts.

``seq`` is global and increasing in file order. ``step`` counts backward passes: forward calls
before the first backward are step 0, the first backward pass is step 0 too, and the forward
calls after it are step 1. ``call`` numbers the calls of one module within one step.

Readers ignore keys they do not know; a key that is absent takes the default below. This module
imports only the standard library: the renderer and the checker read logs without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

SCHEMA_VERSION = 1

Shape = list[int]
Record = Union[
    "Header", "Model", "Module", "ForwardEvent", "BackwardEvent", "ParamGrads", "Anomaly", "Step",
    "End",
]


class SchemaError(ValueError):
    """A record does not have the shape the schema defines."""


def encode_number(x: float) -> float | str:
    """4 significant digits (enough to compare magnitudes, and lines stay short). JSON has no
    NaN/Inf: they are written as the strings "nan", "inf", "-inf"."""
    if math.isfinite(x):
        return float(f"{x:.4g}")
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def decode_number(x: Any) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(x)
    raise SchemaError(f"{x!r} is not a number")


#: Statistics of one gradient tensor: [norm, absmax] and, when the norm is not finite,
#: [norm, absmax, nan_count, inf_count]. None where no gradient flowed.
GradStat = list[float]


def _encode_stats(stats: list[GradStat | None] | None) -> list[Any] | None:
    if stats is None:
        return None
    return [None if s is None else [encode_number(float(v)) for v in s] for s in stats]


def _decode_stats(d: dict[str, Any], key: str) -> list[GradStat | None] | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise SchemaError(f"key {key!r} has the wrong type ({type(value).__name__})")
    out: list[GradStat | None] = []
    for s in value:
        if s is not None and (not isinstance(s, list) or len(s) not in (2, 4)):
            raise SchemaError(f"key {key!r} holds something that is not a gradient statistic")
        out.append(None if s is None else [decode_number(v) for v in s])
    return out


def _compact(d: dict[str, Any]) -> dict[str, Any]:
    """Drop optional keys at their default (None / False) so lines stay short."""
    return {k: v for k, v in d.items() if v is not None and v is not False}


@dataclass(slots=True)
class Header:
    TYPE: ClassVar[str] = "header"
    schema: int
    hooktrace: str
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE, "schema": self.schema, "hooktrace": self.hooktrace,
            "torch": self.torch, "python": self.python, "argv": self.argv, "pid": self.pid,
            "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
            "hostname": self.hostname, "started": self.started, "options": self.options,
        }


@dataclass(slots=True)
class Model:
    """A top-level model: a module first called outside any other traced module."""

    TYPE: ClassVar[str] = "model"
    model: int
    name: str  # the variable it was bound to when first called, else its class name
    cls: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "model": self.model, "name": self.name, "class": self.cls}


@dataclass(slots=True)
class Module:
    """One named module of a model; ``params``/``trainable`` count its own (direct) parameters."""

    TYPE: ClassVar[str] = "module"
    model: int
    name: str  # fqn in named_modules(), "" for the root, wrapper prefixes stripped
    cls: str
    params: int = 0
    trainable: int = 0
    aliases: list[str] | None = None  # further fqns of a module registered in several places

    def to_dict(self) -> dict[str, Any]:
        return _compact({
            "type": self.TYPE, "model": self.model, "name": self.name, "class": self.cls,
            "params": self.params, "trainable": self.trainable, "aliases": self.aliases,
        })


@dataclass(slots=True)
class ForwardEvent:
    TYPE: ClassVar[str] = "event"
    PHASE: ClassVar[str] = "forward"
    seq: int
    step: int
    model: int
    name: str
    call: int
    input_shapes: list[Shape] = field(default_factory=list)  # tensor leaves of args then kwargs
    input_dtypes: list[str] = field(default_factory=list)
    output_shapes: list[Shape] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    no_grad: bool = False  # ran with gradient recording off (torch.no_grad, inference_mode)
    recompute: bool = False  # re-run inside backward by activation checkpointing
    inputs_more: int | None = None  # tensor leaves beyond the ones listed (huge containers)
    outputs_more: int | None = None
    #: outputs holding NaN/Inf, as [output index, nan count, inf count]; absent when all finite
    #: (or when statistics are off)
    output_nonfinite: list[list[int]] | None = None

    @property
    def phase(self) -> str:
        return self.PHASE

    def to_dict(self) -> dict[str, Any]:
        # built by hand, not with _compact: this runs once per module call
        d: dict[str, Any] = {
            "type": "event", "seq": self.seq, "step": self.step, "phase": "forward",
            "model": self.model, "name": self.name, "call": self.call,
            "input_shapes": self.input_shapes, "input_dtypes": self.input_dtypes,
            "output_shapes": self.output_shapes, "output_dtypes": self.output_dtypes,
        }
        if self.no_grad:
            d["no_grad"] = True
        if self.recompute:
            d["recompute"] = True
        if self.inputs_more:
            d["inputs_more"] = self.inputs_more
        if self.outputs_more:
            d["outputs_more"] = self.outputs_more
        if self.output_nonfinite:
            d["output_nonfinite"] = self.output_nonfinite
        return d


@dataclass(slots=True)
class BackwardEvent:
    """Backward of one forward call (``fwd`` is that call's ``seq``).

    ``grad_output_shapes[i]`` is the gradient reaching the i-th tensor output,
    ``grad_input_shapes[i]`` the gradient of the i-th tensor input (``None`` where none flowed).
    Lengths count tensor leaves of the flattened outputs/inputs, kwargs included; for a module
    whose inputs and outputs are plain tensors this equals what ``register_full_backward_hook``
    reports. ``grad_input`` is the input tensor's *total* gradient: where an input also feeds
    another branch (a residual), it includes that branch's share.
    """

    TYPE: ClassVar[str] = "event"
    PHASE: ClassVar[str] = "backward"
    seq: int
    step: int
    model: int
    name: str
    call: int
    fwd: int
    grad_input_len: int = 0
    grad_output_len: int = 0
    grad_input_shapes: list[Shape | None] = field(default_factory=list)
    grad_output_shapes: list[Shape | None] = field(default_factory=list)
    recompute: bool = False
    #: per gradient, like the shapes: [norm, absmax(, nan, inf)] or None; absent with --no-stats
    grad_input_stats: list[GradStat | None] | None = None
    grad_output_stats: list[GradStat | None] | None = None

    @property
    def phase(self) -> str:
        return self.PHASE

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "type": "event", "seq": self.seq, "step": self.step, "phase": "backward",
            "model": self.model, "name": self.name, "call": self.call, "fwd": self.fwd,
            "grad_input_len": self.grad_input_len, "grad_output_len": self.grad_output_len,
            "grad_input_shapes": self.grad_input_shapes,
            "grad_output_shapes": self.grad_output_shapes,
        }
        if self.recompute:
            d["recompute"] = True
        if self.grad_input_stats is not None:
            d["grad_input_stats"] = _encode_stats(self.grad_input_stats)
        if self.grad_output_stats is not None:
            d["grad_output_stats"] = _encode_stats(self.grad_output_stats)
        return d


@dataclass(slots=True)
class ParamGrads:
    """After backward pass ``step``: per module with trainable parameters that took part in the
    step, the norm of its own parameters' ``.grad`` (None: no parameter had a gradient)."""

    TYPE: ClassVar[str] = "params"
    step: int
    model: int
    grad_norm: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "step": self.step, "model": self.model,
                "grad_norm": {k: None if v is None else encode_number(v)
                              for k, v in self.grad_norm.items()}}


@dataclass(slots=True)
class Anomaly:
    """In a watched step (outside ``--steps``, where events are not written): the first module
    whose forward output held NaN/Inf (``nonfinite-forward``), the first whose backward produced
    or received a NaN/Inf gradient (``nonfinite-backward``), or a module that received gradient
    before and no longer does (``no-grad``)."""

    TYPE: ClassVar[str] = "anomaly"
    KINDS: ClassVar[tuple[str, ...]] = ("nonfinite-forward", "nonfinite-backward", "no-grad")
    step: int
    model: int
    name: str
    kind: str
    call: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "step": self.step, "model": self.model, "name": self.name,
                "kind": self.kind, "call": self.call, "detail": self.detail}


@dataclass(slots=True)
class Step:
    """Written when backward pass ``step`` ends; counts the events recorded in that step."""

    TYPE: ClassVar[str] = "step"
    step: int
    forward: int = 0
    backward: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "step": self.step, "forward": self.forward,
                "backward": self.backward}


@dataclass(slots=True)
class End:
    TYPE: ClassVar[str] = "end"
    status: str  # "ok" | "error" | "interrupted"
    events: int = 0
    steps: int = 0  # backward passes completed
    exit_code: int | None = None
    error: dict[str, str] | None = None  # {"type": ..., "message": ...}
    dropped: int | None = None  # events not written because --max-events was reached (while
    # hooks stayed on: with --no-watch they are removed after the last selected step)
    tracer_error: str | None = None  # the tracer failed and stopped; the script went on
    captured: int | None = None  # files written by --capture into <log>.capture/

    def to_dict(self) -> dict[str, Any]:
        return _compact({
            "type": self.TYPE, "status": self.status, "events": self.events,
            "steps": self.steps, "exit_code": self.exit_code, "error": self.error,
            "dropped": self.dropped, "tracer_error": self.tracer_error,
            "captured": self.captured,
        })


END_STATUSES = ("ok", "error", "interrupted")


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise SchemaError(f"missing key {key!r}")
        return default
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SchemaError(f"key {key!r} has the wrong type ({type(value).__name__})")
    return value


def _shapes(d: dict[str, Any], key: str, allow_none: bool = False) -> list[Any]:
    value = _get(d, key, list, [])
    for shape in value:
        if shape is None and allow_none:
            continue
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape
        ):
            raise SchemaError(f"key {key!r} holds something that is not a shape")
    return value  # type: ignore[no-any-return]


def _strs(d: dict[str, Any], key: str) -> list[str]:
    value = _get(d, key, list, [])
    if not all(isinstance(s, str) for s in value):
        raise SchemaError(f"key {key!r} holds something that is not a string")
    return value  # type: ignore[no-any-return]


def _shapes_ok(value: Any, allow_none: bool = False) -> bool:
    if type(value) is not list:
        return False
    for shape in value:
        if type(shape) is list:
            for n in shape:
                if type(n) is not int:
                    return False
        elif not (allow_none and shape is None):
            return False
    return True


def _stats_ok(value: Any) -> bool:
    if value is None:
        return True
    if type(value) is not list:
        return False
    for stat in value:
        if stat is not None:
            if type(stat) is not list or len(stat) != 2:
                return False  # 4 numbers (NaN/Inf counts) take the careful path
            for x in stat:
                if type(x) is not float and type(x) is not int:
                    return False
    return True


_FORWARD_KEYS = 11  # type seq step phase model name call input_/output_ shapes and dtypes
_BACKWARD_KEYS = (12, 14)  # ... fwd, two lengths, two shape lists (and two stats lists)


def _event_fast(d: dict[str, Any]) -> ForwardEvent | BackwardEvent | None:
    """The common event in one pass with cheap type checks, or None for the careful path (an
    optional key, a NaN, a wrong type): reading a million events is mostly this function."""
    get = d.get
    seq, step, model, call, name = get("seq"), get("step"), get("model"), get("call"), get("name")
    if (type(seq) is not int or type(step) is not int or type(model) is not int
            or type(call) is not int or type(name) is not str):
        return None
    phase = get("phase")
    if phase == "forward" and len(d) == _FORWARD_KEYS:
        ins: Any = get("input_shapes")
        outs: Any = get("output_shapes")
        in_types, out_types = get("input_dtypes"), get("output_dtypes")
        if (_shapes_ok(ins) and _shapes_ok(outs) and type(in_types) is list
                and type(out_types) is list and all(type(t) is str for t in in_types)
                and all(type(t) is str for t in out_types)):
            return ForwardEvent(seq, step, model, name, call, ins, in_types, outs, out_types)
    elif phase == "backward" and len(d) in _BACKWARD_KEYS:
        fwd, n_in, n_out = get("fwd"), get("grad_input_len"), get("grad_output_len")
        grad_ins: Any = get("grad_input_shapes")
        grad_outs: Any = get("grad_output_shapes")
        in_stats, out_stats = get("grad_input_stats"), get("grad_output_stats")
        if (type(fwd) is int and type(n_in) is int and type(n_out) is int
                and _shapes_ok(grad_ins, True) and _shapes_ok(grad_outs, True)
                and _stats_ok(in_stats) and _stats_ok(out_stats)):
            return BackwardEvent(seq, step, model, name, call, fwd, n_in, n_out, grad_ins,
                                 grad_outs, False, in_stats, out_stats)
    return None


def _event_from_dict(d: dict[str, Any]) -> ForwardEvent | BackwardEvent:
    fast = _event_fast(d)
    if fast is not None:
        return fast
    phase = _get(d, "phase", str)
    common = dict(seq=_get(d, "seq", int), step=_get(d, "step", int), model=_get(d, "model", int),
                  name=_get(d, "name", str), call=_get(d, "call", int))
    if phase == "forward":
        return ForwardEvent(
            **common,
            input_shapes=_shapes(d, "input_shapes"), input_dtypes=_strs(d, "input_dtypes"),
            output_shapes=_shapes(d, "output_shapes"), output_dtypes=_strs(d, "output_dtypes"),
            no_grad=_get(d, "no_grad", bool, False), recompute=_get(d, "recompute", bool, False),
            inputs_more=_get(d, "inputs_more", int, None),
            outputs_more=_get(d, "outputs_more", int, None),
            output_nonfinite=_shapes(d, "output_nonfinite") or None,
        )
    if phase == "backward":
        return BackwardEvent(
            **common, fwd=_get(d, "fwd", int, -1),
            grad_input_len=_get(d, "grad_input_len", int, 0),
            grad_output_len=_get(d, "grad_output_len", int, 0),
            grad_input_shapes=_shapes(d, "grad_input_shapes", allow_none=True),
            grad_output_shapes=_shapes(d, "grad_output_shapes", allow_none=True),
            recompute=_get(d, "recompute", bool, False),
            grad_input_stats=_decode_stats(d, "grad_input_stats"),
            grad_output_stats=_decode_stats(d, "grad_output_stats"),
        )
    raise SchemaError(f"unknown event phase {phase!r}")


def from_dict(d: Any) -> Record | None:
    """Build the record for one parsed line; ``None`` for a record type this version does not know.

    Raises SchemaError when a known record lacks a key or holds a value of the wrong type.
    """
    if not isinstance(d, dict):
        raise SchemaError(f"a record must be a JSON object, not {type(d).__name__}")
    kind = _get(d, "type", str)
    if kind == "event":
        return _event_from_dict(d)
    if kind == "header":
        return Header(
            schema=_get(d, "schema", int), hooktrace=_get(d, "hooktrace", str, "?"),
            torch=_get(d, "torch", str, None), python=_get(d, "python", str, None),
            argv=_strs(d, "argv"), pid=_get(d, "pid", int, 0), rank=_get(d, "rank", int, 0),
            local_rank=_get(d, "local_rank", int, 0), world_size=_get(d, "world_size", int, 1),
            hostname=_get(d, "hostname", str, None),
            started=_get(d, "started", (int, float), None), options=_get(d, "options", dict, {}),
        )
    if kind == "model":
        return Model(model=_get(d, "model", int), name=_get(d, "name", str),
                     cls=_get(d, "class", str, "?"))
    if kind == "module":
        aliases = _strs(d, "aliases") or None
        return Module(model=_get(d, "model", int), name=_get(d, "name", str),
                      cls=_get(d, "class", str, "?"), params=_get(d, "params", int, 0),
                      trainable=_get(d, "trainable", int, 0), aliases=aliases)
    if kind == "params":
        norms = _get(d, "grad_norm", dict, {})
        return ParamGrads(step=_get(d, "step", int), model=_get(d, "model", int), grad_norm={
            str(k): None if v is None else decode_number(v) for k, v in norms.items()})
    if kind == "anomaly":
        anomaly = _get(d, "kind", str)
        if anomaly not in Anomaly.KINDS:
            return None  # a kind from a newer version: skipped like an unknown record
        return Anomaly(step=_get(d, "step", int), model=_get(d, "model", int),
                       name=_get(d, "name", str), kind=anomaly, call=_get(d, "call", int, 0),
                       detail=_get(d, "detail", dict, {}))
    if kind == "step":
        return Step(step=_get(d, "step", int), forward=_get(d, "forward", int, 0),
                    backward=_get(d, "backward", int, 0))
    if kind == "end":
        status = _get(d, "status", str)
        if status not in END_STATUSES:
            raise SchemaError(f"unknown end status {status!r}")
        return End(status=status, events=_get(d, "events", int, 0), steps=_get(d, "steps", int, 0),
                   exit_code=_get(d, "exit_code", int, None), error=_get(d, "error", dict, None),
                   dropped=_get(d, "dropped", int, None),
                   tracer_error=_get(d, "tracer_error", str, None),
                   captured=_get(d, "captured", int, None))
    return None

"""Reading the wire form: each parsed line of a log checked, events as typed rows.

``Decoder`` keeps the ``module`` and ``tensors`` records it has read and turns every forward and
backward event into a ``ForwardRow`` / ``BackwardRow``: a typed tuple (a long log holds a
million events; readers unpack it), whose ``module`` is an id of ``Decoder.modules`` and whose
tensor signatures are resolved; what few events have beyond that is in its last field, ``more``.
Any other line becomes its record (``from_dict``). Nothing outside this module and
``hooktrace.log.wire`` reads a key of a line. Standard library only: no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

from hooktrace.log.schema import (
    END_STATUSES,
    Anomaly,
    BackwardEvent,
    End,
    ForwardEvent,
    GradStat,
    Header,
    Model,
    Module,
    ParamGrads,
    Record,
    SchemaError,
    Shape,
    Signal,
    Source,
    Step,
)

Signature = tuple[list[Any], list[str]]  # a tensors record: shapes of tensor leaves, dtypes
StepFilter = Callable[[int], bool]  # whether the events of a step are wanted in full


class ForwardMore(NamedTuple):
    """What a forward event has beyond the usual: a flag, more leaves, NaN/Inf outputs."""

    no_grad: bool = False  # ran with gradient recording off
    recompute: bool = False  # re-run inside backward by activation checkpointing
    inputs_more: int | None = None  # tensor leaves beyond the ones listed
    outputs_more: int | None = None
    output_nonfinite: list[list[int]] | None = None  # [output index, nan, inf]


class BackwardMore(NamedTuple):
    """What a backward event has beyond the usual: a flag, lost gradients, or NaN/Inf in its
    statistics (then with both fields at their defaults)."""

    recompute: bool = False
    lost: list[int] | None = None  # inputs that needed a gradient and got none


Stats = list[GradStat | None]  # per gradient: [norm, absmax(, nan, inf)], None: no gradient

#: One forward event: (seq, step, module, call, ins, outs, more). ``module`` is the id of a
#: module record (``Decoder.modules[module]`` is (model, fqn)); ``ins``/``outs`` the signatures
#: of the tensor leaves of the positional then keyword arguments / of the output; ``more`` None
#: for most events (no flag, finite outputs). A plain tuple: a row is made per event, and a
#: tuple subclass costs three times as much to make as the tuple.
ForwardRow = tuple[int, int, int, int, Signature, Signature, ForwardMore | None]

#: The backward of the forward call whose seq is ``fwd``: (seq, step, module, call, fwd,
#: grad_ins, grad_outs, in_stats, out_stats, more): the shapes of the gradient of each tensor
#: input / reaching each tensor output (None: none flowed), their statistics (None: statistics
#: off); ``more`` None for most (no flag, every statistic two finite numbers).
BackwardRow = tuple[int, int, int, int, int, list[Shape | None], list[Shape | None],
                    Stats | None, Stats | None, BackwardMore | None]



class ForwardRows(list[ForwardRow]):
    """Consecutive forward rows, as ``LogReader.scan`` yields them."""

    __slots__ = ()


class BackwardRows(list[BackwardRow]):
    """Consecutive backward rows, as ``LogReader.scan`` yields them."""

    __slots__ = ()


Rows = ForwardRows | BackwardRows

#: What a skimmed row (of a step the filter declined) holds in place of what was not read
NOT_READ: Any = ([], [])
_FORWARD_KEYS = 7  # type seq step module call in out: no optional key
_NONFINITE = BackwardMore()
_PLAIN_FORWARD = ForwardMore()


def _every_step(step: int) -> bool:
    return True


class Decoder:
    """Parsed lines -> rows and records, resolving the ids of ``module`` and ``tensors``
    records; one decoder per pass over a log. ``tensors`` records are consumed here.

    ``steps`` is asked whether a step's events are wanted each time the step of the events
    changes, so that its answer may narrow as the log is read. The rows of a step it declines
    are *skimmed*: seq, step, module, call (and fwd) checked, the rest not read (``NOT_READ``
    signatures, no statistics): the renderer reads the steps it does not draw so."""

    def __init__(self, steps: StepFilter | None = None) -> None:
        self._steps = steps or _every_step
        self._step: Any = None  # the step last asked about, and the answer
        self._wanted = True
        self.modules: dict[int, tuple[int, str]] = {}  # module id -> (model, fqn)
        self.tensors: dict[int, Signature] = {}
        self.end: End | None = None  # the last end record
        self._names: dict[str, str] = {}  # a module id as a params record writes it -> fqn

    def _ask(self, step: int) -> None:
        self._step, self._wanted = step, self._steps(step)

    # Most lines are plain events: checked in ``forward`` / ``backward`` with a few type tests
    # as strictly as ``_forward_row`` / ``_backward_row`` check any line (tests/test_logio.py)
    def forward(self, d: dict[str, Any]) -> ForwardRow:
        """A forward event's row."""
        try:
            seq, step, module, call = d["seq"], d["step"], d["module"], d["call"]
            if (type(seq) is int and type(step) is int and type(call) is int
                    and type(module) is int and module in self.modules):
                if step != self._step:
                    self._ask(step)
                if not self._wanted:
                    return seq, step, module, call, NOT_READ, NOT_READ, None
                if len(d) == _FORWARD_KEYS and type(i := d["in"]) is int \
                        and type(o := d["out"]) is int:
                    tensors = self.tensors
                    return seq, step, module, call, tensors[i], tensors[o], None
        except KeyError:  # a key missing, an id unknown: said by the careful path
            pass
        return self._forward_row(d)

    def backward(self, d: dict[str, Any]) -> BackwardRow:
        """A backward event's row. Statistics of 2 numbers are finite: a NaN/Inf is written as
        a string, with counts."""
        try:
            seq, step, module, call, fwd = d["seq"], d["step"], d["module"], d["call"], d["fwd"]
            if (type(seq) is int and type(step) is int and type(call) is int
                    and type(fwd) is int and type(module) is int and module in self.modules):
                if step != self._step:
                    self._ask(step)
                if not self._wanted:
                    return seq, step, module, call, fwd, [], [], None, None, None
                if (type(i := d["in"]) is int and type(o := d["out"]) is int
                        and "recompute" not in d and "lost" not in d
                        and _plain_stats(ins := d.get("in_stats"), outs := d.get("out_stats"))):
                    tensors = self.tensors
                    return seq, step, module, call, fwd, tensors[i][0], tensors[o][0], ins, outs, \
                        None
        except KeyError:
            pass
        return self._backward_row(d)

    def forward_event(self, row: ForwardRow) -> ForwardEvent:
        """The record of a forward row (the names of its module resolved), made before a later
        ``module`` record can give its id another module."""
        seq, step, module, call, (ins, in_types), (outs, out_types), more = row
        model, name = self.modules[module]
        return ForwardEvent(seq, step, model, name, call, ins, in_types, outs, out_types,
                            *(more or _PLAIN_FORWARD))

    def backward_event(self, row: BackwardRow) -> BackwardEvent:
        """The record of a backward row, like ``forward_event``."""
        seq, step, module, call, fwd, grad_ins, grad_outs, in_stats, out_stats, more = row
        model, name = self.modules[module]
        flags = more or _NONFINITE
        return BackwardEvent(seq, step, model, name, call, fwd, len(grad_ins), len(grad_outs),
                             grad_ins, grad_outs, flags.recompute, in_stats, out_stats,
                             flags.lost)

    def other(self, d: Any, kind: Any) -> Record | None:
        """Any other line (``kind``: its type), a record or None; ``tensors`` and ``module``
        records add to the ids known."""
        if kind == "tensors":
            shapes = _shapes(d, "shapes", allow_none=True)
            self.tensors[_get(d, "id", int)] = (shapes, _strs(d, "dtypes"))
            return None
        if kind == "params":
            return self._params(d)
        record = from_dict(d)
        if type(record) is Module:
            ident = _get(d, "id", int)
            self.modules[ident] = (record.model, record.name)
            if ident >= 0:  # the careful path reads "-1" as no id
                self._names[str(ident)] = record.name
        elif type(record) is End:
            self.end = record
        return record

    def _params(self, d: dict[str, Any]) -> ParamGrads:
        grad_norm = _get(d, "grad_norm", dict, {})
        norms: dict[str, float | None] | None = None
        if {*map(type, grad_norm.values())} <= _NORM_TYPES:
            with contextlib.suppress(KeyError):  # ids as written, norms as floats: built in C
                norms = dict(zip(map(self._names.__getitem__, grad_norm), grad_norm.values(),
                                 strict=True))
        if norms is None:
            norms = {}
            for key, value in grad_norm.items():
                found = self.modules.get(int(key)) if key.isascii() and key.isdigit() else None
                if found is None:
                    raise SchemaError(f"key 'grad_norm' holds {key!r}, not the id of a module "
                                      "record")
                norms[found[1]] = None if value is None else decode_number(value)
        return ParamGrads(step=_get(d, "step", int), model=_get(d, "model", int),
                          grad_norm=norms)

    # -- any event, one key at a time ----------------------------------------------------------

    def _module(self, d: dict[str, Any]) -> int:
        ident = d.get("module")
        if type(ident) is not int or ident not in self.modules:
            raise SchemaError(f"key 'module' is not the id of a module record ({ident!r})")
        return ident

    def _ids(self, d: dict[str, Any], key: str) -> Signature:
        ident = d.get(key)
        if ident is None:
            return [], []
        found = self.tensors.get(ident) if type(ident) is int else None
        if found is None:
            raise SchemaError(f"key {key!r} is not the id of a tensors record ({ident!r})")
        return found

    def _common(self, d: dict[str, Any]) -> tuple[int, int, int]:
        seq, step, call = d.get("seq"), d.get("step"), d.get("call")
        if type(seq) is int and type(step) is int and type(call) is int:
            return seq, step, call
        return _get(d, "seq", int), _get(d, "step", int), _get(d, "call", int)

    def _forward_row(self, d: dict[str, Any]) -> ForwardRow:
        seq, step, call = self._common(d)
        module = self._module(d)
        ins, outs = self._ids(d, "in"), self._ids(d, "out")
        if len(d) <= _FORWARD_KEYS:
            return seq, step, module, call, ins, outs, None
        more = ForwardMore(_get(d, "no_grad", bool, False), _get(d, "recompute", bool, False),
                           _get(d, "inputs_more", int, None), _get(d, "outputs_more", int, None),
                           _shapes(d, "output_nonfinite") or None)
        return seq, step, module, call, ins, outs, None if more == _PLAIN_FORWARD else more

    def _backward_row(self, d: dict[str, Any]) -> BackwardRow:
        seq, step, call = self._common(d)
        module = self._module(d)
        fwd = d.get("fwd", -1)
        if type(fwd) is not int:
            fwd = _get(d, "fwd", int, -1)
        grad_ins, grad_outs = self._ids(d, "in")[0], self._ids(d, "out")[0]
        in_stats, out_stats = d.get("in_stats"), d.get("out_stats")
        plain = True
        if not _stats_ok(in_stats):
            in_stats, plain = _decode_stats(d, "in_stats"), False
        if not _stats_ok(out_stats):
            out_stats, plain = _decode_stats(d, "out_stats"), False
        lost = _get(d, "lost", list, None)
        if lost is not None and not all(type(i) is int for i in lost):
            raise SchemaError(f"backward event: 'lost' must list input indices, got {lost!r}")
        more = BackwardMore(_get(d, "recompute", bool, False), lost or None)
        return seq, step, module, call, fwd, grad_ins, grad_outs, in_stats, out_stats, \
            None if plain and more == _NONFINITE else more


def decode_number(x: Any) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(x)
    raise SchemaError(f"{x!r} is not a number")



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


def _drop(d: dict[str, Any]) -> dict[str, Any]:
    """A module record's ``drop`` as ``Module``'s fields (none where absent or unknown)."""
    drop = _get(d, "drop", dict, {})
    p, per = drop.get("p"), drop.get("per")
    if type(p) not in _NUMBER_TYPES or per not in Module.DROP_UNITS:
        return {}
    return {"drop": float(p), "drop_unit": per}


def _strs(d: dict[str, Any], key: str) -> list[str]:
    value = _get(d, key, list, [])
    if not all(isinstance(s, str) for s in value):
        raise SchemaError(f"key {key!r} holds something that is not a string")
    return value  # type: ignore[no-any-return]


_NUMBER_TYPES = frozenset((float, int))  # not bool: JSON true is no statistic
_NORM_TYPES = frozenset((float, type(None)))


def _stats_ok(value: Any) -> bool:
    if type(value) is not list:
        return value is None
    for stat in value:
        # 4 numbers (NaN/Inf counts) take the careful path
        if stat is not None and (type(stat) is not list or len(stat) != 2
                                 or type(stat[0]) not in _NUMBER_TYPES
                                 or type(stat[1]) not in _NUMBER_TYPES):
            return False
    return True


def _plain_stats(ins: Any, outs: Any) -> bool:
    """``_stats_ok`` of both, quick for the usual one statistic each."""
    if ins is not None and outs is not None:
        try:  # only a list holding a list of 2 numbers unpacks so: a str or dict holds str
            ((a, b),), ((c, d),) = ins, outs
        except (TypeError, ValueError):
            return _stats_ok(ins) and _stats_ok(outs)
        numbers = _NUMBER_TYPES
        return type(a) in numbers and type(b) in numbers and type(c) in numbers \
            and type(d) in numbers
    return _stats_ok(ins) and _stats_ok(outs)


def from_dict(d: Any) -> Record | None:
    """Build the record for one parsed line; ``None`` for a record type this version does not know.

    Raises SchemaError when a known record lacks a key or holds a value of the wrong type.
    """
    if not isinstance(d, dict):
        raise SchemaError(f"a record must be a JSON object, not {type(d).__name__}")
    kind = _get(d, "type", str)
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
                      trainable=_get(d, "trainable", int, 0), aliases=aliases,
                      loose=_strs(d, "loose") or None, wrapper=_get(d, "wrapper", str, None),
                      **_drop(d))
    if kind == "anomaly":
        anomaly = _get(d, "kind", str)
        if anomaly not in Anomaly.KINDS:
            return None  # a kind from a newer version: skipped like an unknown record
        return Anomaly(step=_get(d, "step", int), model=_get(d, "model", int),
                       name=_get(d, "name", str), kind=anomaly, call=_get(d, "call", int, 0),
                       detail=_get(d, "detail", dict, {}))
    if kind == "signal":
        signal = _get(d, "kind", str)
        if signal not in Signal.KINDS:
            return None  # a kind from a newer version: skipped like an unknown record
        return Signal(step=_get(d, "step", int), model=_get(d, "model", int),
                      name=_get(d, "name", str), kind=signal, detail=_get(d, "detail", dict, {}))
    if kind == "source":
        return Source(cls=_get(d, "class", str), file=_get(d, "file", str),
                      line=_get(d, "line", int))
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

"""Reading the wire form: each parsed line of a log checked, events as typed rows.

``Decoder`` keeps the ``module`` and ``tensors`` records it has read and turns every forward and
backward event into a ``ForwardRow`` / ``BackwardRow``: a typed tuple (a long log holds a
million events; readers unpack it), whose ``module`` is an id of ``Decoder.modules`` and whose
tensor signatures are resolved; what few events have beyond that is in its last field, ``more``.
Any other line becomes its record (``schema.from_dict``). Nothing outside this module,
``hooktrace.log.wire`` (which says what writes each kind of line) and ``fields`` reads a key of
a line. Standard library only: no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hooktrace.log.fields import (
    NORM_TYPES,
    NUMBER_TYPES,
    Field,
    decode_number,
    decode_stats,
    fields_of,
    get,
    items,
)
from hooktrace.log.schema import (
    BackwardEvent,
    End,
    ForwardEvent,
    GradStat,
    Module,
    ParamGrads,
    Record,
    SchemaError,
    Shape,
    from_dict,
)
from hooktrace.log.wire import inputs_from

Signature = tuple[list[Any], list[str]]  # a tensors record: shapes of tensor leaves, dtypes
StepFilter = Callable[[int], bool]  # whether the events of a step are wanted in full


class ForwardMore(NamedTuple):
    """What a forward event has beyond the usual: ``ForwardEvent``'s last fields, in its order
    (a flag, more leaves, NaN/Inf outputs; the data flow for a decoder asked for it)."""

    no_grad: bool = False
    recompute: bool = False
    inputs_more: int | None = None
    outputs_more: int | None = None
    output_nonfinite: list[list[int]] | None = None
    inputs_from: list[list[int]] | None = None
    made: list[int] | None = None
    from_out: list[list[int]] | None = None
    made_out: list[list[int]] | None = None
    eval_mode: bool = False
    made_no_history: bool = False


class BackwardMore(NamedTuple):
    """What a backward event has beyond the usual: ``BackwardEvent``'s flags, or NaN/Inf in its
    statistics (then with both fields at their defaults)."""

    recompute: bool = False
    lost: list[int] | None = None


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
_FLOW = ("inputs_from", "made", "from_out", "made_out")  # ForwardMore's, read by ``inputs_from``
#: the rest of a row's ``more``, read as its event's fields (``fields.LogFact``'s rules)
_FORWARD_FLAGS = fields_of(ForwardEvent, tuple(f for f in ForwardMore._fields if f not in _FLOW))
_BACKWARD_FLAGS = fields_of(BackwardEvent, BackwardMore._fields)


def _read(d: dict[str, Any], flags: Sequence[Field]) -> dict[str, Any]:
    return {f.name: f.read(d, f.key, f.default) for f in flags}


def _every_step(step: int) -> bool:
    return True


def stats_ok(value: Any) -> bool:
    if type(value) is not list:
        return value is None
    for stat in value:
        # 4 numbers (NaN/Inf counts) take the careful path
        if stat is not None and (type(stat) is not list or len(stat) != 2
                                 or type(stat[0]) not in NUMBER_TYPES
                                 or type(stat[1]) not in NUMBER_TYPES):
            return False
    return True


def plain_stats(ins: Any, outs: Any) -> bool:
    """``stats_ok`` of both, quick for the usual one statistic each."""
    if ins is not None and outs is not None:
        try:  # only a list holding a list of 2 numbers unpacks so: a str or dict holds str
            ((a, b),), ((c, d),) = ins, outs
        except (TypeError, ValueError):
            return stats_ok(ins) and stats_ok(outs)
        numbers = NUMBER_TYPES
        return type(a) in numbers and type(b) in numbers and type(c) in numbers \
            and type(d) in numbers
    return stats_ok(ins) and stats_ok(outs)


class Decoder:
    """Parsed lines -> rows and records, resolving the ids of ``module`` and ``tensors``
    records; one decoder per pass over a log. ``tensors`` records are consumed here.

    ``steps`` is asked whether a step's events are wanted each time the step of the events
    changes, so that its answer may narrow as the log is read. The rows of a step it declines
    are *skimmed*: seq, step, module, call (and fwd) checked, the rest not read (``NOT_READ``
    signatures, no statistics): the renderer reads the steps it does not draw so.

    ``flow``: read each forward event's data flow into its ``more`` (a log whose header says
    ``dataflow``); otherwise its keys are passed over, and most rows have no ``more``."""

    def __init__(self, steps: StepFilter | None = None, flow: bool = False) -> None:
        self._steps = steps or _every_step
        self._flow = flow
        self._step: Any = None  # the step last asked about, and the answer
        self._wanted = True
        self.modules: dict[int, tuple[int, str]] = {}  # module id -> (model, fqn)
        self.tensors: dict[int, Signature] = {}
        self.end: End | None = None  # the last end record
        self._fqns: dict[str, str] = {}  # a module id as a params record writes it -> fqn

    def _ask(self, step: int) -> None:
        self._step, self._wanted = step, self._steps(step)

    # Most lines are plain events: checked in ``forward`` / ``backward`` with a few type tests
    # as strictly as ``_forward_row`` / ``_backward_row`` check any line (tests/unit/log/)
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
                keys = len(d)
                if keys > _FORWARD_KEYS:
                    keys -= (("from" in d) + ("made" in d) + ("from_out" in d)
                             + ("made_out" in d))  # the data flow: read on request
                if keys == _FORWARD_KEYS and type(i := d["in"]) is int \
                        and type(o := d["out"]) is int:
                    tensors = self.tensors
                    ins = tensors[i]
                    if self._flow:
                        return seq, step, module, call, ins, tensors[o], ForwardMore(
                            False, False, None, None, None, *inputs_from(d, seq, len(ins[0])))
                    return seq, step, module, call, ins, tensors[o], None
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
                        and plain_stats(ins := d.get("in_stats"), outs := d.get("out_stats"))):
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
        model, fqn = self.modules[module]
        return ForwardEvent(seq, step, model, fqn, call, ins, in_types, outs, out_types,
                            *(more or _PLAIN_FORWARD))

    def backward_event(self, row: BackwardRow) -> BackwardEvent:
        """The record of a backward row, like ``forward_event``."""
        seq, step, module, call, fwd, grad_ins, grad_outs, in_stats, out_stats, more = row
        model, fqn = self.modules[module]
        flags = more or _NONFINITE
        return BackwardEvent(seq, step, model, fqn, call, fwd, len(grad_ins), len(grad_outs),
                             grad_ins, grad_outs, flags.recompute, in_stats, out_stats,
                             flags.lost)

    def other(self, d: Any, kind: Any) -> Record | None:
        """Any other line (``kind``: its type), a record or None; ``tensors`` and ``module``
        records add to the ids known."""
        if kind == "tensors":
            self.tensors[get(d, "id", int)] = (items(d, "shapes", "list[list[int] | None]"),
                                               items(d, "dtypes", "list[str]"))
            return None
        if kind == "params":
            return self._params(d)
        record = from_dict(d)
        if type(record) is Module:
            ident = get(d, "id", int)
            self.modules[ident] = (record.model, record.fqn)
            if ident >= 0:  # the careful path reads "-1" as no id
                self._fqns[str(ident)] = record.fqn
        elif type(record) is End:
            self.end = record
        return record

    def _params(self, d: dict[str, Any]) -> ParamGrads:
        grad_norm = get(d, "grad_norm", dict, {})
        norms: dict[str, float | None] | None = None
        if {*map(type, grad_norm.values())} <= NORM_TYPES:
            with contextlib.suppress(KeyError):  # ids as written, norms as floats: built in C
                norms = dict(zip(map(self._fqns.__getitem__, grad_norm), grad_norm.values(),
                                 strict=True))
        if norms is None:
            norms = {}
            for key, value in grad_norm.items():
                found = self.modules.get(int(key)) if key.isascii() and key.isdigit() else None
                if found is None:
                    raise SchemaError(f"key 'grad_norm' holds {key!r}, not the id of a module "
                                      "record")
                norms[found[1]] = None if value is None else decode_number(value)
        return ParamGrads(step=get(d, "step", int), model=get(d, "model", int),
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
        return get(d, "seq", int), get(d, "step", int), get(d, "call", int)

    def _forward_row(self, d: dict[str, Any]) -> ForwardRow:
        seq, step, call = self._common(d)
        module = self._module(d)
        ins, outs = self._ids(d, "in"), self._ids(d, "out")
        if len(d) <= _FORWARD_KEYS and not self._flow:
            return seq, step, module, call, ins, outs, None
        flow: Any = dict(zip(_FLOW, inputs_from(d, seq, len(ins[0])), strict=True)) \
            if self._flow else {}
        more = ForwardMore(**flow, **_read(d, _FORWARD_FLAGS))
        return seq, step, module, call, ins, outs, None if more == _PLAIN_FORWARD else more

    def _backward_row(self, d: dict[str, Any]) -> BackwardRow:
        seq, step, call = self._common(d)
        module = self._module(d)
        fwd = d.get("fwd", -1)
        if type(fwd) is not int:
            fwd = get(d, "fwd", int, -1)
        grad_ins, grad_outs = self._ids(d, "in")[0], self._ids(d, "out")[0]
        in_stats, out_stats = d.get("in_stats"), d.get("out_stats")
        plain = True
        if not stats_ok(in_stats):
            in_stats, plain = decode_stats(d, "in_stats"), False
        if not stats_ok(out_stats):
            out_stats, plain = decode_stats(d, "out_stats"), False
        more = BackwardMore(**_read(d, _BACKWARD_FLAGS))
        return seq, step, module, call, fwd, grad_ins, grad_outs, in_stats, out_stats, \
            None if plain and more == _NONFINITE else more

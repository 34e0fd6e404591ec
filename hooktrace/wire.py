"""The id-compressed wire form of the log contract: records to line dicts and back.

``Encoder`` turns the records of ``hooktrace.schema`` into the dicts the writer writes, naming
modules and tensor signatures by id; ``Decoder`` checks parsed lines against the contract and
resolves those ids. Standard library only: the renderer and the checker read logs without torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

from hooktrace.schema import (
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
    Signal,
    Source,
    Step,
)


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


def _hashable(shapes: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(None if s is None else tuple(s) for s in shapes)


class Encoder:
    """Records -> the dicts written as lines. Events name their module and their tensors by
    id: a ``module`` record (with its ``id``) and a ``tensors`` record (shapes, and dtypes for
    forward ones) are written once, before the first line that uses them. This keeps an event
    near 70 bytes (forward) and 130 (backward, with statistics)."""

    def __init__(self) -> None:
        self._modules: dict[tuple[int, str], int] = {}
        self._tensors: dict[tuple[Any, Any], int] = {}
        self._last_stat: Any = None  # the last statistics tuple encoded, and its encoding
        self._last_encoded: list[Any] = []

    def wire(self, record: Any) -> list[dict[str, Any]]:
        kind = type(record)
        if kind is ForwardEvent:
            return self._forward(record)
        if kind is BackwardEvent:
            return self._backward(record)
        out: list[dict[str, Any]] = []
        if kind is Module:
            self._module(record.model, record.name, out, record)
        elif kind is ParamGrads:
            model = record.model
            norms = {str(self._module(model, name, out)): None if v is None else encode_number(v)
                     for name, v in record.grad_norm.items()}
            out.append({"type": "params", "step": record.step, "model": model,
                        "grad_norm": norms})
        else:
            out.append(record.to_dict())
        return out

    def _module(self, model: int, name: str, out: list[dict[str, Any]],
                record: Module | None = None) -> int:
        key = (model, name)
        ident = self._modules.get(key)
        if ident is None:  # an event of a module without a record: a record that says only that
            ident = self._modules[key] = len(self._modules)
            d: dict[str, Any] = {"type": "module", "id": ident}
            d.update((record or Module(model, name, "?")).to_dict())
            out.append(d)
        return ident

    def _ids(self, shapes: Sequence[Any], dtypes: Sequence[str] | None,
             out: list[dict[str, Any]]) -> int:
        try:
            key = (shapes if type(shapes) is tuple else tuple(shapes), dtypes)
            ident = self._tensors.get(key)
        except TypeError:  # lists (the tracer gives tuples: no conversion on its path)
            key = (_hashable(shapes), None if dtypes is None else tuple(dtypes))
            ident = self._tensors.get(key)
        if ident is None:
            ident = self._tensors[key] = len(self._tensors)
            d: dict[str, Any] = {"type": "tensors", "id": ident,
                                 "shapes": [None if s is None else list(s) for s in shapes]}
            if dtypes is not None:
                d["dtypes"] = list(dtypes)
            out.append(d)
        return ident

    def _forward(self, e: ForwardEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        d: dict[str, Any] = {
            "type": "forward", "seq": e.seq, "step": e.step,
            "module": self._module(e.model, e.name, out), "call": e.call,
            "in": self._ids(e.input_shapes, e.input_dtypes, out),
            "out": self._ids(e.output_shapes, e.output_dtypes, out),
        }
        if e.no_grad:
            d["no_grad"] = True
        if e.recompute:
            d["recompute"] = True
        if e.inputs_more:
            d["inputs_more"] = e.inputs_more
        if e.outputs_more:
            d["outputs_more"] = e.outputs_more
        if e.output_nonfinite:
            d["output_nonfinite"] = e.output_nonfinite
        out.append(d)
        return out

    def _backward(self, e: BackwardEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        d: dict[str, Any] = {
            "type": "backward", "seq": e.seq, "step": e.step,
            "module": self._module(e.model, e.name, out), "call": e.call, "fwd": e.fwd,
            "in": self._ids(e.grad_input_shapes, None, out),
            "out": self._ids(e.grad_output_shapes, None, out),
        }
        if e.recompute:
            d["recompute"] = True
        if e.lost:
            d["lost"] = e.lost
        # out before in: a module's grad_output is, most often, the grad_input of the module
        # written just before it, the same numbers (one tuple): encoded once
        out_stats = self._stats(e.grad_output_stats)
        if e.grad_input_stats is not None:
            d["in_stats"] = self._stats(e.grad_input_stats)
        if out_stats is not None:
            d["out_stats"] = out_stats
        out.append(d)
        return out

    def _stats(self, stats: list[GradStat | None] | None) -> list[Any] | None:
        if stats is None:
            return None
        out: list[Any] = []
        for s in stats:
            if s is None:
                out.append(None)
            elif s is self._last_stat:
                out.append(self._last_encoded)
            else:
                encoded = [encode_number(float(v)) for v in s]
                out.append(encoded)
                if isinstance(s, tuple):  # immutable: the same object holds the same numbers
                    self._last_stat, self._last_encoded = s, encoded
        return out


_FORWARD_KEYS = 7  # type seq step module call in out: no optional key


class Decoder:
    """Parsed lines -> records, resolving the ids of ``module`` and ``tensors`` records. One
    decoder per pass over a log; ``tensors`` records are consumed here, not returned.

    Nearly every line of a long log is a *plain* event: a forward or backward event without the
    optional keys (no_grad, recompute, ...) and with finite statistics. ``forward`` and
    ``backward`` return one as the parsed dict itself, checked as strictly as ``decode`` checks
    it, so that a reader that needs a few keys of each event (check, render) builds no record
    per event: ``modules`` and ``tensors`` resolve its ids, and ``event`` builds its record."""

    def __init__(self, skim: bool = False) -> None:
        # With ``skim``, events of steps outside [keep_from, keep_to] are *skimmed*, for a
        # reader that keeps some steps only (render): checked for the keys every reader reads
        # (seq, step, module; fwd) and no more. The reader may narrow the range as it reads.
        self._skim = skim
        self.keep_from, self.keep_to = -(1 << 62), 1 << 62
        self.modules: dict[int, tuple[int, str]] = {}  # module id -> (model, fqn)
        self.tensors: dict[int, tuple[list[Any], list[str]]] = {}  # id -> (shapes, dtypes)
        self.end: End | None = None  # the last end record
        self._names: dict[str, str] = {}  # a module id as a params record writes it -> fqn

    def decode(self, d: Any) -> Record | None:
        """The record of one parsed line; None for a line that is not one (``tensors``, or a
        type this version does not know). Raises SchemaError for a malformed record."""
        kind = d.get("type") if type(d) is dict else None
        if kind == "forward":
            item: Any = self.forward(d)
        elif kind == "backward":
            item = self.backward(d)
        else:
            return self.other(d, kind)
        return self.event(item) if type(item) is dict else item

    def forward(self, d: dict[str, Any]) -> dict[str, Any] | ForwardEvent:
        """A forward event's line: ``d`` itself, checked, when it is plain (or skimmed); else
        its record."""
        if self._skim and self._skimmed(d):
            return d
        try:
            if (len(d) == _FORWARD_KEYS and type(d["seq"]) is int and type(d["step"]) is int
                    and type(d["call"]) is int and type(m := d["module"]) is int
                    and m in self.modules and type(i := d["in"]) is int and i in self.tensors
                    and type(o := d["out"]) is int and o in self.tensors):
                return d
        except KeyError:
            pass
        return self._forward(d)

    def backward(self, d: dict[str, Any]) -> dict[str, Any] | BackwardEvent:
        """A backward event's line: ``d`` itself, checked, when it is plain; else its record.
        Statistics of 2 numbers are finite: a NaN/Inf is written as a string, with counts."""
        if self._skim and self._skimmed(d) and type(d.get("fwd")) is int:
            return d
        try:
            if (type(d["seq"]) is int and type(d["step"]) is int and type(d["call"]) is int
                    and type(d["fwd"]) is int and type(m := d["module"]) is int
                    and m in self.modules and type(i := d["in"]) is int and i in self.tensors
                    and type(o := d["out"]) is int and o in self.tensors
                    and "recompute" not in d and "lost" not in d
                    and _plain_stats(d.get("in_stats"), d.get("out_stats"))):
                return d
        except KeyError:
            pass
        return self._backward(d)

    def _skimmed(self, d: dict[str, Any]) -> bool:
        """An event of a step outside the kept range, with the keys every reader reads."""
        try:
            step = d["step"]
            return ((step < self.keep_from or step > self.keep_to) and type(step) is int
                    and type(d["seq"]) is int and type(m := d["module"]) is int
                    and m in self.modules)
        except (KeyError, TypeError):  # a key missing, a step that is no number: not skimmed
            return False

    def event(self, d: dict[str, Any]) -> ForwardEvent | BackwardEvent:
        """The record of a plain event, built before ``other`` decodes a later line (a later
        ``tensors`` record could give its id other shapes)."""
        model, name = self.modules[d["module"]]
        if d["type"] == "forward":
            ins, in_types = self.tensors[d["in"]]
            outs, out_types = self.tensors[d["out"]]
            return ForwardEvent(d["seq"], d["step"], model, name, d["call"], ins, in_types, outs,
                                out_types)
        grad_ins, grad_outs = self.tensors[d["in"]][0], self.tensors[d["out"]][0]
        return BackwardEvent(d["seq"], d["step"], model, name, d["call"], d["fwd"], len(grad_ins),
                             len(grad_outs), grad_ins, grad_outs, False, d.get("in_stats"),
                             d.get("out_stats"))

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

    def _module(self, d: dict[str, Any]) -> tuple[int, str]:
        ident = d.get("module")
        found = self.modules.get(ident) if type(ident) is int else None
        if found is None:
            raise SchemaError(f"key 'module' is not the id of a module record ({ident!r})")
        return found

    def _ids(self, d: dict[str, Any], key: str) -> tuple[list[Any], list[str]]:
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

    def _forward(self, d: dict[str, Any]) -> ForwardEvent:
        seq, step, call = self._common(d)
        model, name = self._module(d)
        ins, in_types = self._ids(d, "in")
        outs, out_types = self._ids(d, "out")
        event = ForwardEvent(seq, step, model, name, call, ins, in_types, outs, out_types)
        if len(d) > _FORWARD_KEYS:
            event.no_grad = _get(d, "no_grad", bool, False)
            event.recompute = _get(d, "recompute", bool, False)
            event.inputs_more = _get(d, "inputs_more", int, None)
            event.outputs_more = _get(d, "outputs_more", int, None)
            event.output_nonfinite = _shapes(d, "output_nonfinite") or None
        return event

    def _backward(self, d: dict[str, Any]) -> BackwardEvent:
        seq, step, call = self._common(d)
        model, name = self._module(d)
        fwd = d.get("fwd", -1)
        if type(fwd) is not int:
            fwd = _get(d, "fwd", int, -1)
        grad_ins, grad_outs = self._ids(d, "in")[0], self._ids(d, "out")[0]
        in_stats, out_stats = d.get("in_stats"), d.get("out_stats")
        if not _stats_ok(in_stats):
            in_stats = _decode_stats(d, "in_stats")
        if not _stats_ok(out_stats):
            out_stats = _decode_stats(d, "out_stats")
        lost = _get(d, "lost", list, None)
        if lost is not None and not all(type(i) is int for i in lost):
            raise SchemaError(f"backward event: 'lost' must list input indices, got {lost!r}")
        return BackwardEvent(seq, step, model, name, call, fwd, len(grad_ins), len(grad_outs),
                             grad_ins, grad_outs, _get(d, "recompute", bool, False), in_stats,
                             out_stats, lost or None)


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
                      trainable=_get(d, "trainable", int, 0), aliases=aliases)
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

"""Checked reads of one parsed line's fields, and the records that are not events.

``from_dict`` turns a ``header``, ``model``, ``module``, ``anomaly``, ``signal``, ``source``,
``ops``, ``step`` or ``end`` line into its record; the helpers read one key with its type checked
(a ``SchemaError`` names the key). With ``decoder`` and ``wire``, the only code that reads a
line's keys. Standard library only: no torch.
"""

from __future__ import annotations

from typing import Any

from hooktrace.log.schema import (
    END_STATUSES,
    Anomaly,
    End,
    GradStat,
    Header,
    Model,
    Module,
    Op,
    Ops,
    Record,
    SchemaError,
    Signal,
    Source,
    Step,
)


def decode_number(x: Any) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(x)
    raise SchemaError(f"{x!r} is not a number")



def decode_stats(d: dict[str, Any], key: str) -> list[GradStat | None] | None:
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


def get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise SchemaError(f"missing key {key!r}")
        return default
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SchemaError(f"key {key!r} has the wrong type ({type(value).__name__})")
    return value


def shapes(d: dict[str, Any], key: str, allow_none: bool = False) -> list[Any]:
    value = get(d, key, list, [])
    for shape in value:
        if shape is None and allow_none:
            continue
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape
        ):
            raise SchemaError(f"key {key!r} holds something that is not a shape")
    return value  # type: ignore[no-any-return]


def drop_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A module record's ``drop`` as ``Module``'s fields (none where absent or unknown)."""
    drop = get(d, "drop", dict, {})
    p, per = drop.get("p"), drop.get("per")
    if type(p) not in NUMBER_TYPES or per not in Module.DROP_UNITS:
        return {}
    return {"drop": float(p), "drop_unit": per}


def strs(d: dict[str, Any], key: str) -> list[str]:
    value = get(d, key, list, [])
    if not all(isinstance(s, str) for s in value):
        raise SchemaError(f"key {key!r} holds something that is not a string")
    return value  # type: ignore[no-any-return]


NUMBER_TYPES = frozenset((float, int))  # not bool: JSON true is no statistic
NORM_TYPES = frozenset((float, type(None)))


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


def from_dict(d: Any) -> Record | None:
    """Build the record for one parsed line; ``None`` for a record type this version does not know.

    Raises SchemaError when a known record lacks a key or holds a value of the wrong type.
    """
    if not isinstance(d, dict):
        raise SchemaError(f"a record must be a JSON object, not {type(d).__name__}")
    kind = get(d, "type", str)
    if kind == "header":
        return Header(
            schema=get(d, "schema", int), hooktrace=get(d, "hooktrace", str, "?"),
            torch=get(d, "torch", str, None), python=get(d, "python", str, None),
            argv=strs(d, "argv"), pid=get(d, "pid", int, 0), rank=get(d, "rank", int, 0),
            local_rank=get(d, "local_rank", int, 0), world_size=get(d, "world_size", int, 1),
            hostname=get(d, "hostname", str, None),
            started=get(d, "started", (int, float), None), options=get(d, "options", dict, {}),
            dataflow=get(d, "dataflow", bool, False), eager=get(d, "eager", bool, False),
            made_no_history=get(d, "made_no_history", bool, False),
        )
    if kind == "model":
        return Model(model=get(d, "model", int), name=get(d, "name", str),
                     cls=get(d, "class", str, "?"))
    if kind == "module":
        aliases = strs(d, "aliases") or None
        return Module(model=get(d, "model", int), fqn=get(d, "name", str),
                      cls=get(d, "class", str, "?"), params=get(d, "params", int, 0),
                      trainable=get(d, "trainable", int, 0), aliases=aliases,
                      loose=strs(d, "loose") or None, wrapper=get(d, "wrapper", str, None),
                      alias_of=get(d, "alias_of", str, None), **drop_fields(d))
    if kind == "anomaly":
        anomaly = get(d, "kind", str)
        if anomaly not in Anomaly.KINDS:
            return None  # a kind from a newer version: skipped like an unknown record
        return Anomaly(step=get(d, "step", int), model=get(d, "model", int),
                       fqn=get(d, "name", str), kind=anomaly, call=get(d, "call", int, 0),
                       detail=get(d, "detail", dict, {}))
    if kind == "signal":
        signal = get(d, "kind", str)
        if signal not in Signal.KINDS:
            return None  # a kind from a newer version: skipped like an unknown record
        return Signal(step=get(d, "step", int), model=get(d, "model", int),
                      fqn=get(d, "name", str), kind=signal, detail=get(d, "detail", dict, {}))
    if kind == "source":
        return Source(cls=get(d, "class", str), file=get(d, "file", str),
                      line=get(d, "line", int))
    if kind == "ops":
        return _ops(d)
    if kind == "step":
        return Step(step=get(d, "step", int), forward=get(d, "forward", int, 0),
                    backward=get(d, "backward", int, 0))
    if kind == "end":
        status = get(d, "status", str)
        if status not in END_STATUSES:
            raise SchemaError(f"unknown end status {status!r}")
        return End(status=status, events=get(d, "events", int, 0), steps=get(d, "steps", int, 0),
                   exit_code=get(d, "exit_code", int, None), error=get(d, "error", dict, None),
                   dropped=get(d, "dropped", int, None),
                   tracer_error=get(d, "tracer_error", str, None),
                   captured=get(d, "captured", int, None),
                   backward=get(d, "backward", int, None),
                   compiled=get(d, "compiled", int, None))
    return None


def _offsets(value: Any) -> bool:
    return type(value) is list and all(type(x) is int and x > 0 for x in value)


Flow = tuple[list[list[int]], list[int] | None, list[list[int]] | None, list[list[int]] | None]


def inputs_from(d: dict[str, Any], seq: int, inputs: int) -> Flow:
    """A forward event's data flow (``ForwardEvent.inputs_from``, ``made``, ``from_out`` and
    ``made_out``), its offsets back from ``seq`` resolved; without ``"from"``, each of its
    ``inputs`` came from the call just before it (``hooktrace.log.wire.sources``)."""
    value = d.get("from")
    if value is None:
        found = [[seq - 1]] if inputs == 1 else [[seq - 1] for _ in range(inputs)]
    elif type(value) is list and len(value) == inputs:
        found = []
        for item in value:
            if type(item) is int and item > 0:
                found.append([seq - item])
            elif item is None or _offsets(item):
                found.append(sorted(seq - x for x in item or ()))
            else:
                raise SchemaError("key 'from' holds something that is not an offset to a call")
    else:
        raise SchemaError(f"key 'from' must list one entry per tensor input ({inputs})")
    made = d.get("made")
    if made is not None and not _offsets(made):
        raise SchemaError("key 'made' must list offsets to calls")
    return (found, sorted(seq - x for x in made) if made else None, _from_out(d, found),
            _made_out(d, seq))


def _from_out(d: dict[str, Any], found: list[list[int]]) -> list[list[int]] | None:
    """``"from_out"``: per input, the output of each of its producers that it used."""
    value = d.get("from_out")
    if value is None:
        return None
    if (type(value) is not list or len(value) != len(found)
            or not all(type(outs) is list and len(outs) == len(calls)
                       and all(type(x) is int and x >= -1 for x in outs)
                       for outs, calls in zip(value, found, strict=True))):
        raise SchemaError("key 'from_out' must list, per input, an output index per producer")
    return value


def _made_out(d: dict[str, Any], seq: int) -> list[list[int]] | None:
    """``"made_out"``: per output, offsets back to the calls that made it."""
    value = d.get("made_out")
    if value is None:
        return None
    if type(value) is not list or not all(type(x) is list and (not x or _offsets(x))
                                          for x in value):
        raise SchemaError("key 'made_out' must list, per output, offsets to calls")
    return [sorted(seq - x for x in calls) for calls in value]


def _ints(d: dict[str, Any], key: str) -> list[int]:
    value = get(d, key, list, [])
    if not all(type(i) is int for i in value):
        raise SchemaError(f"key {key!r} holds something that is not a whole number")
    return value  # type: ignore[no-any-return]


def _bools(d: dict[str, Any], key: str) -> list[bool]:
    value = get(d, key, list, [])
    if not all(type(b) is bool for b in value):
        raise SchemaError(f"key {key!r} holds something that is not true or false")
    return value  # type: ignore[no-any-return]


def _op(d: Any) -> Op:
    if not isinstance(d, dict):
        raise SchemaError("key 'ops' holds something that is not an operation")
    return Op(op=get(d, "op", str), file=get(d, "file", str, None),
              line=get(d, "line", int, None), code=get(d, "code", str, None),
              ins=_ints(d, "ins"), outs=_ints(d, "outs"), in_shapes=shapes(d, "in_shapes"),
              out_shapes=shapes(d, "out_shapes"), out_dtypes=strs(d, "out_dtypes"),
              in_grad=_bools(d, "in_grad"), out_grad=_bools(d, "out_grad"),
              child=get(d, "child", str, None), no_grad=get(d, "no_grad", bool, False),
              inplace=get(d, "inplace", bool, False), node=get(d, "node", str, None),
              nonfinite=shapes(d, "nonfinite") or None,
              grad_out=decode_stats(d, "grad_out"), grad_in=decode_stats(d, "grad_in"))


def _ops(d: dict[str, Any]) -> Ops:
    """An ``ops`` line (``hooktrace.log.ops``)."""
    return Ops(step=get(d, "step", int), fwd=get(d, "fwd", int, -1), model=get(d, "model", int),
               fqn=get(d, "name", str), call=get(d, "call", int, 0),
               inputs=get(d, "inputs", int, 0), in_grad=_bools(d, "in_grad"),
               outputs=_ints(d, "outputs"), ops=[_op(op) for op in get(d, "ops", list, [])],
               more=get(d, "more", int, 0))

"""A record's line, derived from its dataclass: ``LogFact.to_dict`` and ``from_dict`` side by side.

Every record but the events and ``params`` is a ``LogFact``: its line is ``{"type": TYPE}`` then
its fields in order, each under its name (``fqn`` as ``"name"``, ``cls`` as ``"class"``:
``KEYS``), read back with its type checked against its annotation (``_READ``; a ``SchemaError``
names the key). The rules, the same for every record, where annotation and default do not say
it all:

* written: a bool only when True; a field whose default is None not at None (``Header``
  writes its nulls: ``NULLS``); a field marked ``OMIT_EMPTY`` not when empty or 0; a list of
  ``GradStat`` with ``encode_number``'s numbers, a list of the records its module defines
  (``Ops.ops``) as their dicts;
* read: an absent key (or null) takes the field's default, or the one its metadata gives
  (``"missing"``); a list whose default is None is None when empty; a word outside its
  metadata's ``"one_of"`` is a SchemaError.

Events (a long log holds a million) are written by ``wire`` and read by ``decoder`` by hand,
with the helpers here: flags derived from a table cost a plain forward event 170 ns more to
write, one with a flag 700 ns. ``params`` names modules by id (``wire``). Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, ClassVar, TypeVar

from hooktrace.log.errors import SchemaError
from hooktrace.log.gradstat import GradStat

#: a field's key where it is not the field's name
KEYS = {"fqn": "name", "cls": "class", "eval_mode": "eval"}
OMIT_EMPTY = {"omit_empty": True}  # field metadata: left out of its line when empty or 0
NUMBER_TYPES = frozenset((float, int))  # not bool: JSON true is no statistic
NORM_TYPES = frozenset((float, type(None)))


def encode_number(x: float) -> float | str:
    """4 significant digits (enough to compare magnitudes, and lines stay short). JSON has no
    NaN/Inf: they are written as the strings "nan", "inf", "-inf"."""
    if math.isfinite(x):
        rounded = float(f"{x:.4g}")
        return rounded if math.isfinite(rounded) else x  # near float max, rounding gives inf
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def decode_number(x: Any) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(x)
    raise SchemaError(f"{x!r} is not a number")


def encode_stats(stats: Any) -> list[Any]:
    return [None if s is None else [encode_number(float(v)) for v in s] for s in stats]


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


def _is_shape(shape: Any) -> bool:
    return isinstance(shape, list) and all(type(n) is int for n in shape)


#: each kind of list a record holds: whether an item is one, and what an item is called
_ITEMS: dict[str, tuple[Any, str]] = {
    "list[str]": (lambda s: isinstance(s, str), "a string"),
    "list[int]": (lambda i: type(i) is int, "a whole number"),
    "list[bool]": (lambda b: type(b) is bool, "true or false"),
    "list[list[int]]": (_is_shape, "a shape"),
    "list[list[int] | None]": (lambda s: s is None or _is_shape(s), "a shape"),  # gradients'
}


def items(d: dict[str, Any], key: str, kind: str) -> list[Any]:
    """The list under ``key`` (``[]`` where absent), each item checked (``_ITEMS[kind]``)."""
    value = get(d, key, list, [])
    ok, what = _ITEMS[kind]
    if not all(map(ok, value)):
        raise SchemaError(f"key {key!r} holds something that is not {what}")
    return value  # type: ignore[no-any-return]


def _scalar(kind: Any) -> Any:
    return lambda d, key, default: get(d, key, kind, default)


def _items(kind: str) -> Any:  # an empty list is the field's default (None where that is None)
    return lambda d, key, default: items(d, key, kind) or default


def _records(item: type[LogFact]) -> Any:
    """Reads a list of records of one kind, each a JSON object (``Ops.ops``)."""
    def read(d: dict[str, Any], key: str, default: Any) -> list[Any]:
        found = get(d, key, list, [])
        for x in found:
            if not isinstance(x, dict):
                raise SchemaError(f"key {key!r} holds {x!r}, not a JSON object")
        return [item.from_dict(x) for x in found]
    return read


#: how a field is read back, by its annotation (``X | None`` as ``X``): (d, key, default) -> value
_READ: dict[str, Any] = {
    "int": _scalar(int), "str": _scalar(str), "bool": _scalar(bool),
    "float": _scalar((int, float)), "dict[str, Any]": _scalar(dict),
    **{kind: _items(kind) for kind in _ITEMS},
    "list[GradStat | None]": lambda d, key, default: decode_stats(d, key),
}
#: the values not written as they are
_WRITE: dict[str, Any] = {"list[GradStat | None]": encode_stats}


class Field:
    """How one field of a record sits on its line (``LogFact``'s rules, for that field)."""

    __slots__ = ("name", "key", "read", "write", "default", "factory", "omit_none",
                 "omit_empty", "one_of")
    read: Any  # (d, key, default) -> value
    write: Any  # value -> what is written, None: the value as it is

    def __init__(self, f: dataclasses.Field[Any], owner: type) -> None:
        kind = str(f.type).removesuffix(" | None")
        self.name, self.key = f.name, KEYS.get(f.name, f.name)
        self.read, self.write = _READ.get(kind), _WRITE.get(kind)
        if self.read is None:  # ``list[Op]``: records its module defines, each as its dict
            self.read = _records(vars(sys.modules[owner.__module__])[kind[5:-1]])
            self.write = lambda values: [v.to_dict() for v in values]
        missing = dataclasses.MISSING
        self.default = f.metadata.get("missing", ...) if f.default is missing else f.default
        self.factory = None if f.default_factory is missing else f.default_factory
        self.omit_none = f.default is None and not getattr(owner, "NULLS", False)
        self.omit_empty = f.metadata.get("omit_empty", False)
        self.one_of = f.metadata.get("one_of")


F = TypeVar("F", bound="LogFact")


_FIELDS: dict[tuple[type, Any], tuple[Field, ...]] = {}


def fields_of(cls: type, names: tuple[str, ...] | None = None) -> tuple[Field, ...]:
    """How the fields ``names`` of ``cls`` (default: all) sit on its line."""
    found = _FIELDS.get((cls, names))
    if found is None:
        found = _FIELDS[cls, names] = tuple(Field(f, cls) for f in dataclasses.fields(cls)
                                            if names is None or f.name in names)
    return found


class LogFact:
    """A record written as its fields (the rules above); ``Op``, a part of an ``ops`` line,
    has no ``TYPE``."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""
    NULLS: ClassVar[bool] = False  # write the fields at None as null

    def to_dict(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_dict(cls: type[F], d: dict[str, Any]) -> F:
        """The record of a parsed line of its type; a SchemaError where a key holds a value of
        the wrong type or one the record requires is missing."""
        return decode(cls, d)


def encode(record: LogFact) -> dict[str, Any]:
    d: dict[str, Any] = {"type": record.TYPE} if record.TYPE else {}
    for f in fields_of(type(record)):
        value = getattr(record, f.name)
        if value is False or (value is None and f.omit_none) or (f.omit_empty and not value):
            continue
        d[f.key] = f.write(value) if f.write is not None and value is not None else value
    return d


def decode(cls: type[F], d: dict[str, Any]) -> F:
    values = {}
    for f in fields_of(cls):
        value = values[f.name] = f.read(d, f.key, f.default if f.factory is None else f.factory())
        if f.one_of is not None and value not in f.one_of:
            raise SchemaError(f"unknown {cls.TYPE} {f.key} {value!r}")
    return cls(**values)


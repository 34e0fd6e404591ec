"""The id-compressed wire form, written: records to the dicts that are a log's lines.

Events name their module and their tensor signatures by id: a ``module`` record (with its
``id``) and a ``tensors`` record are written once, before the first line that uses them. Each
kind of line is written here (``Encoder``: events, ``module``, ``tensors``, ``params`` with
module ids as keys; any other by its ``LogFact.to_dict``) and read back by
``hooktrace.log.decoder.Decoder`` (the data flow by ``inputs_from`` here): a change to one side
is a change to the other, and ``tests/unit/log/test_wire.py`` reads back what is written.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hooktrace.log.fields import encode_number
from hooktrace.log.schema import (
    BackwardEvent,
    ForwardEvent,
    GradStat,
    Module,
    ParamGrads,
    SchemaError,
)


def _all_from_the_call_before(inputs: Sequence[Sequence[int]], seq: int) -> bool:
    """Whether every input came from the call written just before, alone: counted in C, for
    the tracer's tuples and for the lists a reader gives (a log read and written again)."""
    n = len(inputs)
    return inputs.count((seq - 1,)) == n or inputs.count([seq - 1]) == n


def sources(e: ForwardEvent, d: dict[str, Any]) -> None:
    """An event's data flow as offsets back from its seq (``ForwardEvent.inputs_from``): a
    producer is most often the call written just before, so ``"from"`` is left out where every
    input came from it (``seq - 1``), and an input is an offset (one producer), ``null`` (none)
    or a list (several)."""
    seq, inputs = e.seq, e.inputs_from
    assert inputs is not None
    if not _all_from_the_call_before(inputs, seq):
        d["from"] = [seq - calls[0] if len(calls) == 1 else [seq - s for s in calls] if calls
                     else None for calls in inputs]
    if e.made:
        d["made"] = [seq - s for s in e.made]
    if e.from_out and any(any(e.from_out[i]) for i in range(len(e.from_out))):
        d["from_out"] = [list(outs) for outs in e.from_out]
    if e.made_out:
        d["made_out"] = [[seq - s for s in calls] for calls in e.made_out]


def _offsets(value: Any) -> bool:
    return type(value) is list and all(type(x) is int and x > 0 for x in value)


Flow = tuple[list[list[int]], list[int] | None, list[list[int]] | None, list[list[int]] | None]


def inputs_from(d: dict[str, Any], seq: int, inputs: int) -> Flow:
    """A forward event's data flow (``ForwardEvent.inputs_from``, ``made``, ``from_out`` and
    ``made_out``), its offsets back from ``seq`` resolved (``sources`` written)."""
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
    value = d.get("made_out")
    if value is None:
        return None
    if type(value) is not list or not all(type(x) is list and (not x or _offsets(x))
                                          for x in value):
        raise SchemaError("key 'made_out' must list, per output, offsets to calls")
    return [sorted(seq - x for x in calls) for calls in value]


class Encoder:
    """Records -> the dicts written as lines; ids keep an event near 70 bytes (forward) and
    130 (backward, with statistics)."""

    def __init__(self) -> None:
        self._modules: dict[tuple[int, str], int] = {}  # (model, fqn) -> its latest id
        self._records: dict[tuple[int, str], Module] = {}  # the record of that id
        self._ids_given = 0
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
            self._module(record.model, record.fqn, out, record)
        elif kind is ParamGrads:
            model = record.model
            norms = {str(self._module(model, fqn, out)): None if v is None else encode_number(v)
                     for fqn, v in record.grad_norm.items()}
            out.append({"type": "params", "step": record.step, "model": model,
                        "grad_norm": norms})
        else:
            out.append(record.to_dict())
        return out

    def _module(self, model: int, fqn: str, out: list[dict[str, Any]],
                record: Module | None = None) -> int:
        key = (model, fqn)
        ident = self._modules.get(key)
        if ident is None or (record is not None and record != self._records.get(key)):
            # new, or another module put in its place (``model[1] = nn.Sigmoid()``): a record
            # with an id of its own, which the events from here on name. An event of a module
            # without a record: a record that says only that
            ident = self._modules[key] = self._ids_given
            self._ids_given += 1
            self._records[key] = record = record or Module(model, fqn, "?")
            d: dict[str, Any] = {"type": "module", "id": ident}
            d.update(record.to_dict())
            out.append(d)
        return ident

    def _ids(self, shapes: Sequence[Any], dtypes: Sequence[str] | None,
             out: list[dict[str, Any]]) -> int:
        try:
            key = (shapes if type(shapes) is tuple else tuple(shapes), dtypes)
            ident = self._tensors.get(key)
        except TypeError:  # lists (the tracer gives tuples: no conversion on its path)
            key = (tuple(None if s is None else tuple(s) for s in shapes),
                   None if dtypes is None else tuple(dtypes))
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
        try:  # the usual case, a module and tensors seen before: looks in C, no call
            module = self._modules[e.model, e.fqn]
            ins = self._tensors[e.input_shapes, e.input_dtypes]
            outs = self._tensors[e.output_shapes, e.output_dtypes]
        except (KeyError, TypeError):  # new ones (a record first), or lists of shapes
            module = self._module(e.model, e.fqn, out)
            ins = self._ids(e.input_shapes, e.input_dtypes, out)
            outs = self._ids(e.output_shapes, e.output_dtypes, out)
        d: dict[str, Any] = {"type": "forward", "seq": e.seq, "step": e.step, "module": module,
                             "call": e.call, "in": ins, "out": outs}
        if e.no_grad:
            d["no_grad"] = True
        if e.recompute:
            d["recompute"] = True
        if e.eval_mode:
            d["eval"] = True
        if e.made_no_history:
            d["made_no_history"] = True
        if e.inputs_more:
            d["inputs_more"] = e.inputs_more
        if e.outputs_more:
            d["outputs_more"] = e.outputs_more
        if e.output_nonfinite:
            d["output_nonfinite"] = e.output_nonfinite
        if (inputs := e.inputs_from) is not None and (
                e.made or e.from_out or not _all_from_the_call_before(inputs, e.seq)):
            sources(e, d)  # not when every input came from the call just before
        out.append(d)
        return out

    def _backward(self, e: BackwardEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:  # as in _forward; shapes here are lists, whose tuples are hashable
            module = self._modules[e.model, e.fqn]
            ins = self._tensors[tuple(e.grad_input_shapes), None]
            outs = self._tensors[tuple(e.grad_output_shapes), None]
        except (KeyError, TypeError):
            module = self._module(e.model, e.fqn, out)
            ins = self._ids(e.grad_input_shapes, None, out)
            outs = self._ids(e.grad_output_shapes, None, out)
        d: dict[str, Any] = {"type": "backward", "seq": e.seq, "step": e.step, "module": module,
                             "call": e.call, "fwd": e.fwd, "in": ins, "out": outs}
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

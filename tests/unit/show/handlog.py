"""Logs written by hand with the log's own writer, for the unit tests of ``show`` and ``diff``:
``Builder`` numbers the events as the tracer does (``seq`` in file order), ``chain`` writes one
step of a model whose modules run one after another (forward, then backward in reverse)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.log import schema
from hooktrace.log.writer import LogWriter


@dataclass
class Builder:
    """The records of one log, in order; ``write`` puts them behind a header."""

    records: list[Any] = field(default_factory=list)
    seq: int = 0
    events: int = 0
    steps: int = 0

    def model(self, index: int, name: str, cls: str, modules: dict[str, str],
              params: int = 10) -> None:
        """A model and its modules (fqn -> class; the root ``""`` is added when missing)."""
        self.records.append(schema.Model(model=index, name=name, cls=cls))
        self.records.append(schema.Module(model=index, fqn="", cls=cls))
        for fqn, module_cls in modules.items():
            if fqn:
                self.records.append(schema.Module(model=index, fqn=fqn, cls=module_cls,
                                                  params=params, trainable=params))

    def forward(self, step: int, name: str, call: int = 0, model: int = 0,
                ins: Sequence[schema.Shape] = ((4, 8),), outs: Sequence[schema.Shape] = ((4, 8),),
                dtype: str = "float32", **more: Any) -> int:
        self.seq += 1
        self.events += 1
        self.records.append(schema.ForwardEvent(
            seq=self.seq, step=step, model=model, fqn=name, call=call,
            input_shapes=[list(s) for s in ins], input_dtypes=[dtype] * len(ins),
            output_shapes=[list(s) for s in outs], output_dtypes=[dtype] * len(outs), **more))
        return self.seq

    def backward(self, step: int, name: str, fwd: int, call: int = 0, model: int = 0,
                 norm: float | None = 1.0, shape: schema.Shape = (4, 8),
                 grad_input: bool = True, in_shape: schema.Shape | None = None,
                 **more: Any) -> int:
        """A backward event with one grad_output (statistics ``[norm, norm / 2]``; ``norm``
        None: no statistics) and one grad_input (None where ``grad_input`` is False)."""
        self.seq += 1
        self.events += 1
        stat = None if norm is None else _stat(norm)
        self.records.append(schema.BackwardEvent(
            seq=self.seq, step=step, model=model, fqn=name, call=call, fwd=fwd,
            grad_input_len=1, grad_output_len=1,
            grad_input_shapes=[list(in_shape or shape) if grad_input else None],
            grad_output_shapes=[list(shape)],
            grad_input_stats=None if norm is None else [stat if grad_input else None],
            grad_output_stats=None if norm is None else [stat], **more))
        return self.seq

    def params(self, step: int, norms: dict[str, float | None], model: int = 0) -> None:
        self.records.append(schema.ParamGrads(step=step, model=model, grad_norm=dict(norms)))

    def end_step(self, step: int, forward: int, backward: int) -> None:
        self.records.append(schema.Step(step=step, forward=forward, backward=backward))
        self.steps += 1

    def write(self, path: Path, *, dataflow: bool = False, stats: bool = True,
              steps: str = "0:10", end: bool = True, rank: int = 0, world_size: int = 1
              ) -> Path:
        header = schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0", torch="2.x",
                               python="3.x", argv=["train.py"], pid=1, hostname="host",
                               rank=rank, local_rank=rank, world_size=world_size,
                               started=1700000000.0,
                               options={"stats": stats, "steps": steps}, dataflow=dataflow)
        writer = LogWriter(path)
        tail = [schema.End(status="ok", events=self.events, steps=self.steps)] if end else []
        for record in [header, *self.records, *tail]:
            writer.write(record)
        writer.close()
        return path


def _stat(norm: float) -> list[float]:
    if norm != norm or norm in (float("inf"), float("-inf")):
        return [norm, norm, 32.0 if norm != norm else 0.0, 0.0 if norm != norm else 32.0]
    return [norm, norm / 2]


def chain(b: Builder, step: int, names: Sequence[str], norms: Sequence[float | None] | None = None,
          *, model: int = 0, shapes: Sequence[schema.Shape] | None = None,
          dtype: str = "float32", dataflow: bool = False, params: bool = True) -> None:
    """One step of a model whose modules ``names`` run in that order inside its root: forward
    (each leaf, then the root), backward (the root, then the leaves in reverse), the parameter
    norms and the step record. ``norms``: each leaf's grad_output norm (default 1.0);
    ``shapes``: each leaf's output shape (default 4x8); ``dataflow``: each call's input made by
    the call before it (the first: a model input)."""
    norms = list(norms) if norms is not None else [1.0] * len(names)
    outs = list(shapes) if shapes is not None else [(4, 8)] * len(names)
    seqs: list[int] = []
    for i, name in enumerate(names):
        ins = [(4, 8)] if i == 0 else [outs[i - 1]]
        flow: dict[str, Any] = {}
        if dataflow:
            flow["inputs_from"] = [(seqs[-1],)] if seqs else [()]
        seqs.append(b.forward(step, name, model=model, ins=ins, outs=[outs[i]], dtype=dtype,
                              **flow))
    root_flow: dict[str, Any] = {"inputs_from": [()], "made": [seqs[-1]]} if dataflow else {}
    root = b.forward(step, "", model=model, ins=[(4, 8)], outs=[outs[-1]], dtype=dtype,
                     **root_flow)
    b.backward(step, "", root, model=model, norm=norms[-1], shape=outs[-1], grad_input=False)
    for i in reversed(range(len(names))):
        b.backward(step, names[i], seqs[i], model=model, norm=norms[i], shape=outs[i],
                   grad_input=i > 0, in_shape=outs[i - 1] if i else None)
    if params:
        b.params(step, {name: norms[i] for i, name in enumerate(names)}, model=model)
    b.end_step(step, len(names) + 1, len(names) + 1)

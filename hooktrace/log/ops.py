"""The ``ops`` record: the tensor operations one zoomed module call ran, each with its line.

Part of the log contract (``schema`` re-exports it): standard library only. Written and read
back as ``LogFact``s (``fields``), their statistics' numbers as the events' are.

Inside a zoomed call (``hooktrace run --ops GLOB``, or a module the tracer chose after a
recorded step showed something wrong there) each tensor operation, and each call of a child
module, is one ``Op``, in the order they ran. Tensors are named by *slots*, numbers local to the
call: ``0 .. inputs-1`` are the call's positional tensor inputs, each new tensor an operation
makes takes the next number, an in-place operation keeps its tensor's; ``-1`` is a tensor from
outside the call (a parameter, a buffer, a tensor made from numpy). ``outputs`` are the slots
of the call's output tensors, so a reader can follow the data from an input to the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hooktrace.log.fields import OMIT_EMPTY, LogFact
from hooktrace.log.gradstat import GradStat

#: operations through which a value leaves torch (no gradient can follow it)
LEAVING = frozenset({"Tensor.numpy", "Tensor.tolist", "Tensor.item"})
#: ``Tensor.NAME`` attributes (not methods) that give a tensor
ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH", "real", "imag", "grad"})


@dataclass(slots=True)
class Op(LogFact):
    """One tensor operation (or child module call: ``child``) of a zoomed call."""

    #: ``Tensor.detach``, ``Tensor.data`` (an attribute), ``torch.sigmoid``, ``F.relu``; for a
    #: child module's call its class
    op: str
    file: str | None = None  # where it ran: the innermost frame that is not torch's
    line: int | None = None
    code: str | None = None  # that line's text, stripped (at most 120 characters)
    child: str | None = None  # a child module's call: its fqn
    node: str | None = None  # the autograd node of its first output (``SigmoidBackward0``)
    #: in backward, what its node received (per node output) and passed back (per node input,
    #: None where nothing flowed); absent when the node never ran (or statistics are off)
    grad_out: list[GradStat | None] | None = None
    grad_in: list[GradStat | None] | None = None
    #: outputs with NaN/Inf: [output index, nan, inf] (a list the statistics fill: empty, and
    #: left out, where every output is finite)
    nonfinite: list[list[int]] | None = field(default=None, metadata=OMIT_EMPTY)
    ins: list[int] = field(default_factory=list)  # slots of its tensor inputs
    outs: list[int] = field(default_factory=list)  # slots of its tensor outputs
    in_shapes: list[list[int]] = field(default_factory=list)
    out_shapes: list[list[int]] = field(default_factory=list)
    out_dtypes: list[str] = field(default_factory=list)
    in_grad: list[bool] = field(default_factory=list)  # each input required a gradient
    out_grad: list[bool] = field(default_factory=list)  # each output requires a gradient
    no_grad: bool = False  # ran with gradient recording off (inside torch.no_grad())
    inplace: bool = False  # changed its first input in place (``clamp_``, ``+=``, ``x[i] = v``)

    @property
    def leaves_torch(self) -> bool:
        """Its result is no tensor: a number, a list, a numpy array."""
        return self.op in LEAVING

    @property
    def site(self) -> str | None:
        """``file:line``, where known."""
        return f"{self.file}:{self.line}" if self.file is not None else None

    @property
    def text(self) -> str:
        """How code writes it: ``.detach()``, ``.data``, ``torch.sigmoid()``, ``F.relu()``."""
        if self.child is not None:
            return f"{self.child} ({self.op})"
        owner, _, name = self.op.rpartition(".")
        if owner == "Tensor":
            return f".{name}" if name in ATTRIBUTES else f".{name}()"
        return f"{self.op}()"


@dataclass(slots=True)
class Ops(LogFact):
    """The operations of one zoomed call, written after its step's events (``fwd``: its
    forward event's ``seq``; -1 where the call has none, as when the log was full)."""

    TYPE: ClassVar[str] = "ops"
    step: int
    fwd: int = field(metadata={"missing": -1})
    model: int
    fqn: str
    call: int = field(metadata={"missing": 0})
    inputs: int = 0  # its positional tensor inputs: slots 0 .. inputs-1
    in_grad: list[bool] = field(default_factory=list)  # each of them required a gradient
    outputs: list[int] = field(default_factory=list)  # slots of its output tensors
    ops: list[Op] = field(default_factory=list)
    more: int = field(default=0, metadata=OMIT_EMPTY)  # operations past the cap, not listed

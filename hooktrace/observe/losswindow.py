"""The loss window: one ``TorchFunctionMode`` that follows a recorded step's operations from a
model call's end to ``backward()``, where a training loop builds its loss. An operation whose
output has no gradient though an input needed one cut the graph there; what is made from its
output carries the cut; an escape to numpy or a Python number is remembered; an addition of a
term with gradient and one that carries a cut is a candidate term; ``F.cross_entropy`` and
``F.nll_loss`` count their targets read, and a regression loss whose target has gradient is
noted. Every operation returns what it returns; an error turns the window off.

The window is on torch's mode stack only while it follows: it leaves it as ``backward()``
begins (the loss is done), at an optimizer step (the step ends) and when tracing stops; one that
turned itself off (``CAP`` operations, an error) or was closed inside its own handler leaves at
the next model call or optimizer step. It is never pushed above a mode of the program's.
"""

from __future__ import annotations

import linecache
import sys
from types import FrameType
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from hooktrace.hooks.opzoom import function_name
from hooktrace.hooks.sites import NOT_USERS, OURS, shown
from hooktrace.observe.lossgraph import Share, calls, zero

CAP = 4096  # operations one window follows
_DETACH = frozenset({"Tensor.detach", "Tensor.detach_", "Tensor.data"})
_ESCAPES = {"Tensor.numpy": "numpy", "Tensor.item": "item", "Tensor.__float__": "item",
            "Tensor.tolist": "item"}
_ADDS = frozenset({"Tensor.add", "Tensor.__add__", "Tensor.__radd__", "Tensor.__iadd__",
                   "Tensor.add_", "torch.add", "Tensor.sub", "Tensor.__sub__",
                   "Tensor.__rsub__", "Tensor.__isub__", "Tensor.sub_", "torch.sub",
                   "torch.stack", "torch.cat"})
#: tensors made from data: from numpy (or a number an escape gave)
_FROM_DATA = frozenset({"torch.tensor", "torch.as_tensor", "torch.asarray"})
#: losses comparing a prediction with a target: a target with gradient is looked at
_REGRESSION = frozenset({"F.mse_loss", "F.l1_loss", "F.smooth_l1_loss", "F.huber_loss"})
#: those, and the losses whose targets read are counted
_LOSSES = _REGRESSION | {"F.cross_entropy", "F.nll_loss"}
#: tensors made from nothing: constants (a loss accumulator's start)
_MADE = frozenset({"torch.zeros", "torch.ones", "torch.full", "torch.empty", "torch.tensor",
                   "torch.scalar_tensor", "torch.zeros_like", "torch.ones_like"})
_grad_enabled = torch.is_grad_enabled


class Cut(NamedTuple):
    """Where a tensor lost its gradient: ``detach``, ``no_grad``, ``numpy``, ``item`` or
    ``op`` (an op with no derivative), the op, and the user's line that ran it."""

    reason: str
    op: str
    file: str
    line: int
    code: str
    #: the traced calls whose outputs the tensor was computed from: [model, fqn] each
    calls: tuple[tuple[int, str], ...] = ()


class _Term(NamedTuple):
    node: Any  # the addition's autograd node
    cut: Cut
    file: str  # where it was added
    line: int


def _site(frame: FrameType | None) -> tuple[str, int, str] | None:
    """The innermost frame that is neither torch's nor the standard library's; None where
    hooktrace's own code is met first (its hooks' operations)."""
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith(OURS):
            return None
        if not file.startswith(NOT_USERS):
            code = linecache.getline(file, frame.f_lineno).strip()[:120]
            return shown(file), frame.f_lineno, code
        frame = frame.f_back
    return None


def _get(table: WeakIdKeyDictionary, t: torch.Tensor) -> Cut | None:
    found: Cut | None = table.get(t)  # type: ignore[no-untyped-call]
    return found


class Window(TorchFunctionMode):
    """Follows the operations of one window; the loss observer opens and closes it."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.broken = False  # an error, or a mode the program pushed above it: off for the run
        self._stale = False  # closed, and maybe still on torch's stack
        self._names: dict[Any, str] = {}
        self.clear()

    def clear(self) -> None:
        self.ops = 0
        self.cuts = WeakIdKeyDictionary()
        self.made = WeakIdKeyDictionary()  # constants made in the window
        self.escapes: list[tuple[Cut, Any]] = []  # (where, the number; None for numpy)
        self.terms: list[_Term] = []
        self.targets: list[tuple[Any, Cut]] = []  # regression losses whose target has gradient
        self.shares: list[tuple[Share, Any]] = []  # targets read of a loss call, its node

    # -- on and off torch's stack -------------------------------------------------------------
    def open(self) -> None:
        """On the stack, cleared, as a recorded step's model call returns."""
        if self.on or self.broken or torch.compiler.is_compiling():
            return
        self.clear()
        if not self._off():
            self.broken = True  # a mode the program pushed above it: left alone
        elif not torch._C._len_torch_function_stack():
            # not above a mode of the program's (``with torch.device(...)``) or the op zoom's:
            # it would take that mode's place when the program pops it
            torch._C._push_on_torch_function_stack(self)
            self.on = True

    def close(self) -> None:
        """Off the stack where it is its top; else (inside its own handler, where torch has
        taken it off for the while) at the next ``leave_stale``."""
        self.on = False
        if not self._pop():
            self._stale = True

    def leave_stale(self) -> None:
        """A model call begins or an optimizer steps: a closed window still on the stack
        leaves it (in between, each op passed through it)."""
        if self._stale and not self.on:
            self._stale = not self._off()

    def _pop(self) -> bool:
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is self:
            torch._C._pop_torch_function_stack()
            return True
        return False

    def _off(self) -> bool:
        """The window off torch's stack, from its top only; False where it stays (a mode pushed
        above it)."""
        return self._pop() or not any(torch._C._get_function_stack_at(i) is self
                                      for i in range(torch._C._len_torch_function_stack()))

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self.on:
            try:
                self._see(func, args, kwargs, out, sys._getframe(1))
            except Exception:
                self.on, self._stale = False, True
        return out

    def _see(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any,
             frame: FrameType) -> None:
        self.ops += 1
        if self.ops > CAP:
            self.on, self._stale = False, True
            return
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = function_name(func)
        if isinstance(out, torch.Tensor):
            if name in _LOSSES:
                self._loss(name, args, kwargs or {}, out, frame)
            if out.requires_grad:
                if name in _ADDS:
                    self._added(args, out, frame)
                return
            cut = self._input_cut(name, args, frame)
            if cut is None and name in _FROM_DATA and args:
                cut = self._made_back(args[0])
            if cut is not None:
                self.cuts[out] = cut
            elif name in _MADE:
                self.made[out] = True
        elif isinstance(out, tuple):  # (values, indices) of max, the parts of split
            outs = [t for t in out if isinstance(t, torch.Tensor) and not t.requires_grad]
            cut = self._input_cut(name, args, frame) if outs else None
            if cut is not None:
                for t in outs:
                    self.cuts[t] = cut
        elif name in _ESCAPES and args and isinstance(args[0], torch.Tensor):
            t = args[0]
            cut = _get(self.cuts, t)
            if cut is None and not t.requires_grad:
                return
            site = _site(frame)
            if site is not None:
                came = cut.calls if cut is not None else calls(t)
                self.escapes.append((Cut(_ESCAPES[name], name, *site, came),
                                     None if name == "Tensor.numpy" else out))

    def _input_cut(self, name: str, args: tuple[Any, ...], frame: FrameType) -> Cut | None:
        """The cut an input (or a tensor in a list of inputs) carries, or the one this op makes
        (an input needed a gradient)."""
        for t in [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))
                  if isinstance(t, torch.Tensor)]:
            cut = _get(self.cuts, t)
            if cut is None and t.requires_grad:
                cut = self._cut(name, frame, t)
            if cut is not None:
                return cut
        return None

    def _cut(self, name: str, frame: FrameType, t: torch.Tensor) -> Cut | None:
        site = _site(frame)
        if site is None:
            return None
        reason = "detach" if name in _DETACH else "op" if _grad_enabled() else "no_grad"
        return Cut(reason, name, *site, calls(t))

    def _made_back(self, data: Any) -> Cut | None:
        """A tensor made from a number an escape gave, or from numpy after a numpy escape."""
        if isinstance(data, (int, float)):
            return self._escaped(data)
        return self._escaped(None) if type(data).__module__ == "numpy" else None

    def _escaped(self, number: Any) -> Cut | None:
        """The escape that gave ``number``; to numpy where it is None."""
        return next((c for c, v in self.escapes if v == number), None)

    def _added(self, args: tuple[Any, ...], out: torch.Tensor, frame: FrameType) -> None:
        for a in (args[0] if args and isinstance(args[0], (list, tuple)) else args[:2]):
            cut = None
            if isinstance(a, torch.Tensor) and not a.requires_grad:
                cut = _get(self.cuts, a)
                if cut is None and a.dim() == 0 and a not in self.made:
                    # made outside every op followed here (torch.from_numpy): after .numpy(),
                    # unless it is 0 (an accumulator made before the window; read only here)
                    cut = self._escaped(None)
                    if cut is not None and float(a) == 0.0:
                        cut = None
            elif isinstance(a, float) and a != 0.0:
                cut = self._escaped(a)
            if cut is not None:
                site = _site(frame)
                if site is not None and out.grad_fn is not None:
                    self.terms.append(_Term(out.grad_fn, cut, site[0], site[1]))
                return

    def _loss(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: torch.Tensor, frame: FrameType) -> None:
        """A regression loss whose target has gradient; the targets ``F.cross_entropy`` and
        ``F.nll_loss`` read (not left to ``ignore_index``), counted on their device."""
        target = args[1] if len(args) > 1 else kwargs.get("target")
        if not isinstance(target, torch.Tensor):
            return
        if name in _REGRESSION:
            if out.requires_grad and target.requires_grad and len(self.targets) < 16:
                site = _site(frame)
                if site is not None and out.grad_fn is not None:
                    self.targets.append((out.grad_fn, Cut("target", name, *site)))
            return
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        if target.is_floating_point() or not isinstance(ignore, int) or len(self.shares) >= 16:
            return
        site = _site(frame)
        if site is not None:
            with torch.no_grad():
                read = (target != ignore).sum()
            detail = {"by": "ignore_index", "loss": name, "ignore_index": ignore,
                      "file": site[0], "line": site[1]}
            self.shares.append((Share(detail, read, zero(target.device), target.numel()),
                                out.grad_fn))

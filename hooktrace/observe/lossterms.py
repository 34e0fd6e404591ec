"""Every loss term counts: the terms added into a recorded pass's loss that carry no gradient,
and how much of its batch a classification loss reads.

In a recorded step, from the end of a model call until ``backward()`` (the window where a
training loop builds its loss), a ``TorchFunctionMode`` follows the operations: an operation
whose output has no gradient though an input needed one cut the graph there (``.detach()``,
``.data``, an op under ``torch.no_grad()``, an op with no derivative such as ``argmax``); its
output, and what is made from it, carry that cut. A tensor that went to numpy or a Python
number (``.numpy()``, ``.item()``) is remembered as an escape: a number of the same value, or
a tensor made back from numpy, added to the loss came from it. An addition (``+``, ``-``,
``torch.stack``) of a term with a gradient and one that carries a cut is a candidate; as
``backward()`` begins, it is a ``loss-term-cut`` signal where its node lies on the root's
arithmetic top (sums, scales, means), i.e. it is a term of the loss, not an addition inside a
model. ``F.cross_entropy`` and ``F.nll_loss`` met in the window count their targets that are
not ``ignore_index`` (an op of theirs, read once as the pass ends): ``loss-share``, where some
are ignored.

A constant that never had a gradient (a loss accumulator started at ``torch.zeros(())``, a
Python number, a regulariser of frozen weights) cuts nothing and is not said. A loss computed
inside a model's own call (the first call of a step) is not in the window.

Cost: nothing outside recorded steps, nor before a step's first model call returns; in the
window one Python call per torch operation (at most ``CAP``, then the window closes), a
dictionary look per input of an op without gradient. An error here closes the window for the
run; the program's operations return what they return.
"""

from __future__ import annotations

import contextlib
import sys
import sysconfig
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from hooktrace.hooks.opzoom import op_name
from hooktrace.hooks.records import ForwardEnd, Mode, Observer, PassEnd
from hooktrace.hooks.sites import shown
from hooktrace.log import schema

Emit = Callable[[Any], None]

CAP = 4096  # operations one window follows
_TOP_BUDGET = 64  # nodes of a root's arithmetic top looked at
_OURS = str(Path(__file__).parent.parent)
_SKIP = (str(Path(torch.__file__).parent), "<frozen ", *sorted({
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}))
_DETACH = frozenset({"Tensor.detach", "Tensor.detach_", "Tensor.data"})
_ESCAPES = {"Tensor.numpy": "numpy", "Tensor.item": "item", "Tensor.__float__": "item",
            "Tensor.tolist": "item"}
_ADDS = frozenset({"Tensor.add", "Tensor.__add__", "Tensor.__radd__", "Tensor.__iadd__",
                   "Tensor.add_", "torch.add", "Tensor.sub", "Tensor.__sub__",
                   "Tensor.__rsub__", "Tensor.__isub__", "Tensor.sub_", "torch.sub",
                   "torch.stack", "torch.cat"})
#: tensors made from data: from numpy (or a number an escape gave)
_FROM_DATA = frozenset({"torch.tensor", "torch.as_tensor", "torch.asarray"})
_SHARES = frozenset({"F.cross_entropy", "F.nll_loss"})
#: tensors made from nothing: constants (a loss accumulator's start)
_MADE = frozenset({"torch.zeros", "torch.ones", "torch.full", "torch.empty", "torch.tensor",
                   "torch.scalar_tensor", "torch.zeros_like", "torch.ones_like"})
#: autograd ops (node names without ``Backward<n>``) a loss goes through after its terms meet
_TOP = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sum", "Mean", "Stack", "Cat", "View",
                  "Squeeze", "Unsqueeze", "Reshape", "Clone", "ToCopy"})
_grad_enabled = torch.is_grad_enabled


class Cut(NamedTuple):
    """Where a tensor lost its gradient: ``detach``, ``no_grad``, ``numpy``, ``item`` or
    ``op`` (an op with no derivative), the op, and the user's line that ran it."""

    reason: str
    op: str
    file: str
    line: int
    code: str


class _Term(NamedTuple):
    node: Any  # the addition's autograd node
    cut: Cut
    file: str  # where it was added
    line: int


def _site(frame: FrameType | None) -> tuple[str, int, str] | None:
    """The innermost frame that is neither torch's nor the standard library's; None where
    hooktrace's own code is met first (its hooks' operations)."""
    import linecache
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith(_OURS):
            return None
        if not file.startswith(_SKIP):
            code = linecache.getline(file, frame.f_lineno).strip()[:120]
            return shown(file), frame.f_lineno, code
        frame = frame.f_back
    return None


def _get(table: WeakIdKeyDictionary, t: torch.Tensor) -> Cut | None:
    found: Cut | None = table.get(t)  # type: ignore[no-untyped-call]
    return found


def _tensors(args: tuple[Any, ...]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


class Window(TorchFunctionMode):
    """Follows the operations of one window; ``LossTerms`` opens and closes it."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.ops = 0
        self.cuts: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.made: WeakIdKeyDictionary = WeakIdKeyDictionary()  # constants made in the window
        self.escapes: list[tuple[Cut, Any]] = []  # (where, the number; None for numpy)
        self.terms: list[_Term] = []
        # (cut site of the loss call, targets read (a tensor), targets, ignore_index, model)
        self.shares: list[tuple[Cut, torch.Tensor, int, int]] = []
        self._names: dict[Any, str] = {}

    def clear(self) -> None:
        self.ops = 0
        self.cuts = WeakIdKeyDictionary()
        self.made = WeakIdKeyDictionary()
        self.escapes.clear()
        self.terms.clear()
        self.shares.clear()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self.on:
            try:
                self._see(func, args, kwargs, out, sys._getframe(1))
            except Exception:
                self.on = False
        return out

    def _see(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any,
             frame: FrameType) -> None:
        self.ops += 1
        if self.ops > CAP:
            self.on = False
            return
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = op_name(func)
        if isinstance(out, torch.Tensor):
            if name in _SHARES:
                self._share(name, args, kwargs, frame)
            if out.requires_grad:
                if name in _ADDS:
                    self._added(args, out, frame)
                return
            cut = None
            for t in _tensors(args):
                cut = _get(self.cuts, t)
                if cut is None and t.requires_grad:
                    cut = self._cut(name, frame)
                if cut is not None:
                    break
            if cut is None and name in _FROM_DATA and args:
                cut = self._made_back(args[0])
            if cut is not None:
                self.cuts[out] = cut
            elif name in _MADE:
                self.made[out] = True
        elif name in _ESCAPES and args and isinstance(args[0], torch.Tensor):
            t = args[0]
            cut = _get(self.cuts, t)
            if cut is None and not t.requires_grad:
                return
            site = _site(frame)
            if site is not None:
                self.escapes.append((Cut(_ESCAPES[name], name, *site),
                                     None if name == "Tensor.numpy" else out))

    def _cut(self, name: str, frame: FrameType) -> Cut | None:
        site = _site(frame)
        if site is None:
            return None
        reason = "detach" if name in _DETACH else "op" if _grad_enabled() else "no_grad"
        return Cut(reason, name, *site)

    def _made_back(self, data: Any) -> Cut | None:
        """A tensor made from a number an escape gave, or from numpy after a numpy escape."""
        if isinstance(data, (int, float)):
            return next((c for c, v in self.escapes if v is not None and v == data), None)
        if type(data).__module__ == "numpy":
            return next((c for c, v in self.escapes if v is None), None)
        return None

    def _added(self, args: tuple[Any, ...], out: torch.Tensor, frame: FrameType) -> None:
        for a in (args[0] if args and isinstance(args[0], (list, tuple)) else args[:2]):
            cut = None
            if isinstance(a, torch.Tensor) and not a.requires_grad:
                cut = _get(self.cuts, a)
                if cut is None and a.dim() == 0 and a not in self.made:
                    # made outside every op followed here (torch.from_numpy): after .numpy()
                    cut = next((c for c, v in self.escapes if v is None), None)
            elif isinstance(a, float) and a != 0.0:
                cut = next((c for c, v in self.escapes if v is not None and v == a), None)
            if cut is not None:
                site = _site(frame)
                if site is not None and out.grad_fn is not None:
                    self.terms.append(_Term(out.grad_fn, cut, site[0], site[1]))
                return

    def _share(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
               frame: FrameType) -> None:
        kwargs = kwargs or {}
        target = args[1] if len(args) > 1 else kwargs.get("target")
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        if not isinstance(target, torch.Tensor) or target.is_floating_point() or \
                not isinstance(ignore, int) or len(self.shares) >= 16:
            return
        site = _site(frame)
        if site is not None:
            with torch.no_grad():
                read = (target != ignore).sum()
            self.shares.append((Cut("share", name, *site), read, target.numel(), ignore))


def arithmetic_top(roots: list[Any]) -> set[Any]:
    """The nodes from the roots down through sums, scales, means, views: where terms meet."""
    seen: set[Any] = set(roots)
    queue = deque(roots)
    while queue and len(seen) < _TOP_BUDGET:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None or child in seen:
                continue
            name = type(child).__name__
            cut = name.rfind("Backward")
            if (name[:cut] if cut > 0 else name) in _TOP:
                seen.add(child)
                queue.append(child)
    return seen


class LossTerms(Observer):
    """Opens the window when a recorded step's model call returns; ``looked`` (from the loss
    graph's wrapper, as an outermost recorded ``backward()`` begins) closes it."""

    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._window = Window()
        self._broken = False
        self._stale = False  # the window may still be on torch's stack, closed
        self._said: set[tuple[str, str, int]] = set()
        self._signals: list[schema.Signal] = []
        self._shares: list[tuple[Cut, torch.Tensor, int, int, int]] = []
        # an optimizer steps outside the window: its operations do not pass through it
        self._handle = register_optimizer_step_pre_hook(lambda *_: self.model_call(None, None,
                                                                                   0))

    def forward_end(self, end: ForwardEnd) -> None:
        if end.top and not end.in_backward and not self._window.on and not self._broken:
            self._open()

    def model_call(self, module: Any, info: Any, step: int) -> None:
        if self._stale and not self._window.on:  # closed inside backward(): off the stack now
            self._stale = not self._off()

    def _open(self) -> None:
        w = self._window
        try:
            if torch.compiler.is_compiling():
                return
            w.clear()
            if not self._off():
                self._broken = True  # a mode the program pushed above it: left alone
                return
            torch._C._push_on_torch_function_stack(w)
            w.on = True
        except Exception:
            self._broken = True

    def _off(self) -> bool:
        """The window off torch's stack, from its top only; False where it stays (a mode pushed
        above it). ``backward()`` runs inside the window's handler of ``Tensor.backward``, where
        torch has taken it off the stack for the while: it is taken off at the next optimizer
        step or model call (in between, each op passes through it)."""
        w = self._window
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is w:
            torch._C._pop_torch_function_stack()
            return True
        return not any(torch._C._get_function_stack_at(i) is w for i in range(depth))

    def _close(self) -> None:
        self._window.on = False
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is self._window:
            torch._C._pop_torch_function_stack()
        else:
            self._stale = True  # maybe inside its own handler: looked at again later

    def looked(self, step: int, roots: list[Any], models: set[int]) -> None:
        """An outermost recorded ``backward()`` of ``roots`` begins (``models``: those its walk
        reached)."""
        try:
            self._close()
            w = self._window
            model = min(models) if models else None
            if model is not None and w.terms:
                self._terms(step, model, models, arithmetic_top(roots))
            if model is not None:
                self._shares.extend((*s, model) for s in w.shares)
            w.clear()
        except Exception:
            self._broken = True

    def _terms(self, step: int, model: int, models: set[int], top: set[Any]) -> None:
        for term in self._window.terms:
            key = (term.cut.reason, term.cut.file, term.cut.line)
            if term.node not in top or key in self._said:
                continue
            self._said.add(key)
            self._signals.append(schema.Signal(step, model, "", "loss-term-cut", {
                **term.cut._asdict(), "added_file": term.file, "added_line": term.line,
                "models": sorted(models)}))

    def backward_end(self, end: PassEnd) -> None:
        try:
            self._close()
            self._window.clear()
            signals, self._signals = self._signals, []
            shares, self._shares = self._shares, []
            if end.mode is Mode.RECORDED and shares:
                reads = torch.stack([s[1] for s in shares]).tolist()  # one read
                for (cut, _, total, ignore, model), read in zip(shares, reads, strict=True):
                    if read < total:
                        signals.append(schema.Signal(end.step, model, "", "loss-share", {
                            "loss": cut.op, "read": int(read), "of": total,
                            "ignore_index": ignore, "file": cut.file, "line": cut.line}))
            for s in signals:
                self._emit(s)
        except Exception:
            self._broken = True

    def stop(self, step: int, mode: Mode) -> None:
        self._broken = True
        self._handle.remove()
        with contextlib.suppress(Exception):
            self._close()

"""The op-level zoom: the tensor operations that chosen module calls run, each with its line.

While a chosen call runs (in a recorded step), a ``TorchFunctionMode`` sees every operation of
the torch API: its name as code writes it (``clamp_``, ``detach``, ``.data``, ``.numpy()``),
its tensors, and the output with its autograd node already set, on which a post hook gives the
gradient the node received and passed back. A ``TorchDispatchMode`` sees none of that: it runs
below autograd (no ``grad_fn`` yet, so no backward), as aten ops (``x[0] = 1`` is ``select`` +
``fill_``, ``.numpy()`` and ``.data`` are not there) from inside torch's frames (measured:
docs/architecture.md). The core calls ``enter`` from its forward pre-hook and ``leave`` first
thing in its post-hook, also when the call raised; the mode is on torch's stack only while a
chosen call's own code runs (not inside a child that is not chosen, nor most of the hooks'
own work), so nothing outside it pays.

Inside a chosen call, each child module's call is one entry too (its own operations are its
own, recorded only where the child is chosen as well). Operations hooktrace's own hooks run are
not recorded. An error here stops the zoom (``on_error``), never the program: every operation
returns what it returns without the mode.
"""

from __future__ import annotations

import functools
import linecache
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple, Protocol

import torch
from torch.overrides import TorchFunctionMode

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.sites import NOT_USERS, OURS, shown
from hooktrace.hooks.tensors import dtype_name, leaves, shape_of
from hooktrace.log.ops import LEAVING, Op

#: what a zoomed call may record: operations per call (more are counted), calls per step
MAX_OPS = 256
MAX_CALLS = 256
_CODE_CHARS = 120

_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                              "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
                              "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})
_grad_enabled = torch.is_grad_enabled
_graph_task = torch._C._current_graph_task_id

#: (tensor, a list to append [index, nan, inf] to, index): the statistics' NaN/Inf look
Look = Callable[[torch.Tensor, list[list[int]], int], None]
#: (gradient, target list, index): the statistics' numbers of a gradient into ``target[index]``
GradStats = Callable[[torch.Tensor, list[Any], int], None]


def function_name(func: Any) -> str:
    """``Tensor.detach``, ``Tensor.data``, ``torch.sigmoid``, ``F.relu``; "" for what is no
    operation (an attribute that gives no tensor is filtered by its result)."""
    name = getattr(func, "__name__", "") or ""
    qualname = getattr(func, "__qualname__", "") or ""
    if name == "__get__":  # a tensor attribute: .data, .T
        return "Tensor." + (getattr(getattr(func, "__self__", None), "__name__", "") or "?")
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + name
    module = getattr(func, "__module__", "") or ""
    if module in ("torch.nn.functional", "torch._C._nn"):
        return "F." + name
    if qualname.startswith("_VariableFunctionsClass.") or module.startswith("torch"):
        return "torch." + name
    return f"{module}.{name}" if module else name


class Zoomed:
    """One zoomed call: its operations, and the tensors they made, by slot, while it runs."""

    __slots__ = ("info", "call", "inputs", "in_grad", "ops", "more", "outputs", "slots",
                 "keep")

    def __init__(self, info: ModInfo, call: Any, inputs: list[torch.Tensor]) -> None:
        self.info = info
        self.call = call  # the core's handle on the call: its forward record once it returned
        self.inputs = len(inputs)
        self.in_grad = [t.requires_grad for t in inputs]
        self.ops: list[Op] = []
        self.more = 0
        self.outputs: list[int] = []
        self.slots: dict[int, int] = {id(t): i for i, t in enumerate(inputs)}
        self.keep: list[torch.Tensor] = list(inputs)  # alive while it runs: ids stay theirs

    def slot(self, t: torch.Tensor) -> int:
        return self.slots.get(id(t), -1)

    def new_slot(self, t: torch.Tensor) -> int:
        slot = self.slots.get(id(t))
        if slot is None:
            slot = self.slots[id(t)] = len(self.keep)
            self.keep.append(t)
        return slot


class _Frame(NamedTuple):
    """A call followed while a zoom runs: its ``Zoomed`` where it is zoomed itself, and its
    entry in the zoomed call around it, where there is one."""

    module: Any
    zoomed: Zoomed | None
    entry: Op | None
    parent: Zoomed | None


def _dropped(zoomed: Zoomed) -> None:
    pass


class ZoomRequests(Protocol):
    """What an observer may ask of the zoom (``OpZoom``): it asks, and never sets its fields."""

    def choose(self, info: ModInfo) -> bool:
        """Zoom into ``info``'s calls from now on; False when they were chosen already."""
        ...

    def new_step(self) -> None:
        """A pass ended: the calls of the next step are zoomed again, ``MAX_CALLS`` at most."""
        ...

    def close(self) -> None:
        """Tracing stops: nothing more is zoomed."""
        ...


class OpZoom(TorchFunctionMode):
    """Records the operations of the calls of ``chosen`` modules (none until ``connect``);
    observers choose them through ``ZoomRequests``."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        super().__init__()
        self.chosen: set[ModInfo] = set()  # the modules whose calls are zoomed (the core reads)
        self.depth = 0  # calls followed now (the core reads it)
        self.calls_left = MAX_CALLS  # in this step (``new_step`` resets it)
        self.active = True
        self._on_error = on_error
        self._on_call: Callable[[Zoomed], None] = _dropped
        self._look: Look | None = None
        self._grads: GradStats | None = None
        self._frames: list[_Frame] = []
        self._top: Zoomed | None = None  # the innermost frame's zoomed call, if zoomed
        self._pushed = False  # the mode is on torch's stack
        self._paused_at: int | None = None  # the stack's depth when it paused
        self._thread = 0
        self._names: dict[Any, str] = {}
        self._sites: dict[tuple[Any, int], tuple[str, int, str]] = {}

    def connect(self, on_call: Callable[[Zoomed], None], look: Look | None,
                grads: GradStats | None) -> None:
        """``on_call`` gets each zoomed call when it returns; ``look`` and ``grads`` are the
        statistics' NaN/Inf look and gradient numbers (None without statistics)."""
        self._on_call, self._look, self._grads = on_call, look, grads

    # -- what observers ask (``ZoomRequests``) ------------------------------------------------
    def choose(self, info: ModInfo) -> bool:
        if info in self.chosen:
            return False
        self.chosen.add(info)
        return True

    def new_step(self) -> None:
        self.calls_left = MAX_CALLS

    # -- the core's calls ----------------------------------------------------------------------
    def enter(self, module: Any, info: ModInfo, call: Any, args: tuple[Any, ...]) -> None:
        """A call begins: one of ``chosen`` in a recorded step (``call`` the core's handle), or
        any call inside one."""
        try:
            if self.depth and threading.get_ident() != self._thread:
                return  # another thread's call: not followed
            parent = self._top
            entry = None
            if parent is not None:
                entry = self._child(parent, info, args)
            zoomed = None
            if (info in self.chosen and call is not None and self.active and self.calls_left
                    and _graph_task() == -1):  # not a checkpoint's recompute
                self.calls_left -= 1
                zoomed = Zoomed(info, call, leaves(args)[0])
            if not self.depth:
                if zoomed is None:
                    return
                self._thread = threading.get_ident()
            self._frames.append(_Frame(module, zoomed, entry, parent))
            self.depth += 1
            self._top = zoomed
            self._place()
        except Exception as e:
            self._fail(e)

    def _place(self) -> None:
        """The mode on torch's stack while a zoomed call's own code runs, off inside a child
        that is not zoomed (its operations, and its children's hooks, then pay nothing). A mode
        the program pushed meanwhile (``with torch.device(...)``) keeps its place: the zoom
        pauses only from the top of the stack, and resumes only onto the stack it left."""
        depth = torch._C._len_torch_function_stack()
        if not self.depth:  # the zoomed call is over: off, from wherever it is
            if self._pushed:
                self._pop_mode()
            self._pushed, self._paused_at = False, None
        elif self._top is None and self._pushed and depth and \
                torch._C._get_function_stack_at(depth - 1) is self:
            torch._C._pop_torch_function_stack()
            self._pushed, self._paused_at = False, depth - 1
        elif self._top is not None and not self._pushed and \
                (self._paused_at is None or depth == self._paused_at):
            torch._C._push_on_torch_function_stack(self)
            self._pushed, self._paused_at = True, None

    def leave(self, module: Any, rest: tuple[Any, ...]) -> None:
        """A call followed returned (``rest``: the post-hook's kwargs and output) or raised
        (``rest`` empty); calls above it that ended without a post-hook end with it."""
        if threading.get_ident() != self._thread:
            return
        frames = self._frames
        if not any(f.module is module for f in frames):
            return
        try:
            while frames:
                frame = frames.pop()
                self.depth -= 1
                done = frame.module is module
                output = rest[1] if done and len(rest) == 2 else None
                self._finish(frame, output)
                if done:
                    break
        except Exception as e:
            self._fail(e)
        finally:
            self._top = frames[-1].zoomed if frames else None
            if not frames:
                self.depth = 0
            self._place()

    def close(self) -> None:
        """Tracing stops: the mode off torch's stack, what was followed dropped."""
        self.active = False
        self._frames.clear()
        self._top = None
        self.depth = 0
        self._place()

    # -- the mode ------------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **kwargs) if kwargs else func(*args)
        zoomed = self._top
        if zoomed is not None and self.active and \
                not sys._getframe(1).f_code.co_filename.startswith(OURS):  # the hooks' own
            try:
                self._record(zoomed, func, args, kwargs, out)
            except Exception as e:
                self._fail(e)
        return out

    def _record(self, zoomed: Zoomed, func: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any] | None, out: Any) -> None:
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = function_name(func)
        outs = leaves(out)[0]
        if not outs and name not in LEAVING and not _inplace(name):
            return  # a shape, a number, a flag: no operation on values
        site = self._site(sys._getframe(2), ours=True)
        if site is None:
            return  # hooktrace's own hooks, inside a zoomed call
        if len(zoomed.ops) >= MAX_OPS:
            zoomed.more += 1
            return
        ins = leaves(args, kwargs)[0] if kwargs else leaves(args)[0]
        inplace = _inplace(name) and bool(ins)
        if inplace and not outs:
            outs = ins[:1]  # x[i] = v: the tensor changed
        op = _entry(name, site, zoomed, ins)
        op.inplace = inplace
        self._outputs(zoomed, op, outs)
        zoomed.ops.append(op)
        if self._grads is not None:
            node = next((t.grad_fn for t in outs if t.grad_fn is not None), None)
            if node is not None and not op.no_grad:
                node.register_hook(functools.partial(self._backward, op))

    def _outputs(self, zoomed: Zoomed, op: Op, outs: list[torch.Tensor]) -> None:
        op.outs = [zoomed.new_slot(t) for t in outs]
        op.out_shapes = [list(shape_of(t)) for t in outs]
        op.out_dtypes = [dtype_name(t.dtype) for t in outs]
        op.out_grad = [t.requires_grad for t in outs]
        node = next((t.grad_fn for t in outs if t.grad_fn is not None), None)
        op.node = type(node).__name__ if node is not None else None
        if self._look is not None:
            found: list[list[int]] = []
            for j, t in enumerate(outs):
                self._look(t, found, j)
            op.nonfinite = found  # filled now, or when a device's numbers are read

    def _backward(self, op: Op, grad_inputs: tuple[Any, ...],
                  grad_outputs: tuple[Any, ...]) -> None:
        """The op's node ran (a post hook: returns nothing, changes nothing)."""
        if op.grad_out is not None or not self.active or self._grads is None:
            return  # a second pass over the graph (retain_graph): the first one is kept
        try:
            op.grad_out = [None] * len(grad_outputs)
            op.grad_in = [None] * len(grad_inputs)
            for target, grads in ((op.grad_out, grad_outputs), (op.grad_in, grad_inputs)):
                for i, g in enumerate(grads):
                    if isinstance(g, torch.Tensor):
                        self._grads(g, target, i)
        except Exception as e:
            self._fail(e)

    # -- child calls ---------------------------------------------------------------------------
    def _child(self, parent: Zoomed, info: ModInfo, args: tuple[Any, ...]) -> Op | None:
        """The entry of a child's call in the zoomed call around it; its outputs at ``leave``."""
        site = self._site(sys._getframe(2), ours=False)
        if len(parent.ops) >= MAX_OPS:
            parent.more += 1
            return None
        op = _entry(info.cls, site, parent, leaves(args)[0])
        op.child = info.fqn
        parent.ops.append(op)
        return op

    def _finish(self, frame: _Frame, output: Any) -> None:
        if frame.entry is not None and frame.parent is not None and output is not None:
            self._outputs(frame.parent, frame.entry, leaves(output)[0])
        zoomed = frame.zoomed
        if zoomed is not None:
            if output is not None:
                zoomed.outputs = [zoomed.slot(t) for t in leaves(output)[0]]
            zoomed.slots.clear()
            zoomed.keep.clear()  # the call's tensors are its own again
            self._on_call(zoomed)

    # -- where code is -------------------------------------------------------------------------
    def _site(self, frame: FrameType | None, ours: bool) -> tuple[str, int, str] | None:
        """The innermost frame that is neither torch's nor the standard library's: file, line
        and its text. ``ours``: None when hooktrace's own code is met first."""
        while frame is not None:
            file = frame.f_code.co_filename
            if file.startswith(OURS):
                if ours:
                    return None
            elif not file.startswith(NOT_USERS):
                key = (frame.f_code, frame.f_lineno)
                site = self._sites.get(key)
                if site is None:
                    text = linecache.getline(file, frame.f_lineno).strip()
                    site = self._sites[key] = (shown(file), frame.f_lineno,
                                               text[:_CODE_CHARS])
                return site
            frame = frame.f_back
        return ("?", 0, "")

    def _pop_mode(self) -> None:
        """Take the mode off torch's stack, also from under modes pushed after it."""
        above = []
        while torch._C._len_torch_function_stack():
            mode = torch._C._pop_torch_function_stack()
            if mode is self:
                break
            above.append(mode)
        for mode in reversed(above):
            torch._C._push_on_torch_function_stack(mode)

    def _fail(self, error: BaseException) -> None:
        self.active = False  # the mode passes every operation through until it is popped
        self._on_error(error)


def _inplace(name: str) -> bool:
    short = name.rpartition(".")[2]
    return (short.endswith("_") and not short.endswith("__")) or short in _INPLACE_DUNDERS


def _entry(name: str, site: tuple[str, int, str] | None, zoomed: Zoomed,
           ins: list[torch.Tensor]) -> Op:
    file, line, code = site if site is not None else (None, None, None)
    return Op(name, file, line, code or None, ins=[zoomed.slot(t) for t in ins],
              in_shapes=[list(shape_of(t)) for t in ins],
              in_grad=[t.requires_grad for t in ins], no_grad=not _grad_enabled())

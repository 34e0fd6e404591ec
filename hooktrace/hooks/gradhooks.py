"""Gradient hooks on the autograd graph, and the end of each backward pass.

One prehook per autograd node (kept in ``node.metadata``), shared by every module call that has
a tensor made by that node: it calls their callbacks latest-registered first, so a parent's
backward starts before its last child's (hooks on one node would run in registration order).
A leaf tensor has no node: it gets one tensor hook with the same dispatch, kept while the tensor
lives (a graph can be backpropagated twice), its old calls dropped after each pass. A tensor that
views another whole has a fallback on its base's node, taken only where an in-place op rebuilt
the view's own node (``_Fallback``): a base's node also runs for the base's other uses.

The first gradient seen in an autograd graph task queues an engine callback; when the outermost
task ends (nested ones come from reentrant checkpointing), ``on_pass_end`` runs: one call per
backward pass.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.variable import Variable

from hooktrace.log.errors import NonFiniteError

#: (call, index, gradient): ``index`` >= 0 is the call's output ``index``, < 0 its input ``~index``
GradCallback = Callable[[Any, int, torch.Tensor], None]

_MAX_LEAVES = 4096  # leaf tensors hooked at once; forward-only code never ends a pass: bound it


#: in a dispatch's ``shape`` slot: the entry of a tensor that views another whole, whose base's
#: node holds a fallback entry (a ``_Fallback``) for when an in-place op rebuilt its node
_VIEW = object()


class _Fallback:
    """A whole view's entry on its base's node, for a pass in which the view's own node never
    ran. An in-place op that rebuilt the view's node (``ReLU(inplace=True)`` on a ``Linear``'s
    3-d output) sends the view's gradient through its base's node only: the view changed since
    (while it lives), or its old node, which the in-place op's backward held, went in a
    backward pass (or is still there, kept for another). A view that died unchanged took its
    node with it, before any backward: no gradient came its way (a module's output nobody
    used), and its base's node runs for others."""

    __slots__ = ("shape", "_view", "_version", "_own", "_end")

    def __init__(self, t: torch.Tensor, own: _NodeDispatch) -> None:
        self.shape = t.shape
        self._view = weakref.ref(t)
        self._version = t._version
        # held here, the end's callback holds no fallback: no reference cycle
        self._end = end = _NodeEnd()
        self._own = weakref.ref(own, end.ended)  # the prehook of the view's own node

    def rebuilt(self) -> bool:
        t = self._view()
        if t is not None:
            return t._version != self._version
        return self._own() is not None or self._end.in_backward


class _NodeEnd:
    """When an autograd node went: inside a backward pass, or not."""

    __slots__ = ("in_backward",)

    def __init__(self) -> None:
        self.in_backward = False

    def ended(self, _ref: Any) -> None:
        self.in_backward = torch._C._current_graph_task_id() != -1


class _NodeDispatch(list[Any]):
    """The prehook of one autograd node: a flat list of (output_nr, call, index, shape)
    quadruples, so that a registration allocates no tuple and no bound method. ``shape`` is
    None for a plain entry, ``_VIEW`` for a whole view's own, and the view's shape for its
    fallback on the base's node. These objects live as long as the graph (often into the next
    step): the fewer, the rarer Python's full collections."""

    __slots__ = ("hooks", "__weakref__")
    hooks: GradHooks  # set right after creation: an __init__ calling list's costs a third more

    def __call__(self, grad_outputs: Sequence[torch.Tensor | None]) -> None:
        hooks = self.hooks
        if not hooks.active:
            return None
        try:
            hooks.activity()
            on_grad = hooks.on_grad
            for k in range(len(self) - 4, -1, -4):  # latest registered first
                grad = grad_outputs[self[k]]
                if grad is not None:
                    shape = self[k + 3]
                    if shape is None:
                        on_grad(self[k + 1], self[k + 2], grad)
                    else:
                        hooks.viewed(self[k + 1], self[k + 2], grad, shape)
        except NonFiniteError:
            raise  # --break-on nan: stopping the program is what the user asked for
        except Exception as e:  # never break the user's backward
            hooks.on_error(e)
        return None


class GradHooks:
    def __init__(self, on_grad: GradCallback, on_pass_end: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.active = True
        self.on_grad = on_grad
        self.on_error = on_error
        self._on_pass_end = on_pass_end
        self._open_tasks: set[int] = set()
        self._viewed: set[tuple[Any, int]] = set()  # whole views whose own node ran this pass
        # id(leaf) -> (weak reference, dispatch, hook handle)
        self._leaves: dict[int, tuple[weakref.ref[torch.Tensor], _NodeDispatch, Any]] = {}

    @property
    def in_backward(self) -> bool:
        return bool(self._open_tasks)

    def attach(self, t: torch.Tensor, call: Any = None, index: int = 0) -> None:
        """Call ``on_grad(call, index, grad)`` when ``t`` receives its gradient; with no call,
        only follow the backward pass (for its end)."""
        node = t.grad_fn
        if node is None:
            if call is not None:
                self._attach_leaf(t, call, index)
            return
        shape = None
        if call is not None and t._is_view() and not isinstance(node, BackwardCFunction):
            # a view of a whole tensor (``F.linear`` on a 3-d input returns one): an in-place
            # op on it later (``ReLU(inplace=True)``, ``x += y``) rebuilds the view's node, and
            # the old one never runs; the base's node still does, with the same gradient: a
            # fallback there (not for a custom ``autograd.Function``'s output that views its
            # input: its node is the function's backward)
            base = t._base
            if (base is not None and base.grad_fn is not None and base.numel() == t.numel()
                    and base.dtype == t.dtype):
                fallback = _Fallback(t, self._dispatch(node))
                self._dispatch(base.grad_fn).extend((base.output_nr, call, index, fallback))
                shape = _VIEW
        dispatch = self._dispatch(node)
        if call is not None:
            dispatch.extend((t.output_nr, call, index, shape))

    def _dispatch(self, node: Any) -> _NodeDispatch:
        metadata: dict[Any, Any] = node.metadata  # a dict at runtime
        dispatch: _NodeDispatch | None = metadata.get(self)
        if dispatch is None:
            dispatch = metadata[self] = _NodeDispatch()
            dispatch.hooks = self
            node.register_prehook(dispatch)
        return dispatch

    def viewed(self, call: Any, index: int, grad: torch.Tensor, shape: Any) -> None:
        """A whole view's gradient: from its own node (``_VIEW``), or from its base's where
        its own never ran in this pass because an in-place op rebuilt it (a ``_Fallback``),
        in the view's shape."""
        key = (call, index)
        if shape is _VIEW:
            self._viewed.add(key)
            self.on_grad(call, index, grad)
        elif key not in self._viewed and shape.rebuilt():
            self.on_grad(call, index, grad.reshape(shape.shape))

    def _attach_leaf(self, t: torch.Tensor, call: Any, index: int) -> None:
        entry = self._leaves.get(id(t))
        if entry is None or entry[0]() is not t:
            if len(self._leaves) >= _MAX_LEAVES:
                self.remove_leaf_hooks()
            dispatch = _NodeDispatch()
            dispatch.hooks = self
            handle = t.register_hook(lambda g: dispatch((g,)))  # type: ignore[no-untyped-call]
            entry = self._leaves[id(t)] = (weakref.ref(t), dispatch, handle)
        entry[1].extend((0, call, index, None))

    def prune_leaf_hooks(self, keep: Callable[[Any], bool]) -> None:
        """Drop the callbacks of calls ``keep`` rejects, and the hooks of freed leaves."""
        for key, (ref, dispatch, handle) in list(self._leaves.items()):
            dispatch[:] = [x for k in range(0, len(dispatch), 4) if keep(dispatch[k + 1])
                           for x in dispatch[k: k + 4]]
            if ref() is None or not dispatch:
                handle.remove()
                del self._leaves[key]

    def activity(self) -> None:
        task = torch._C._current_graph_task_id()
        if task not in self._open_tasks:
            self._open_tasks.add(task)
            Variable._execution_engine.queue_callback(lambda: self._task_done(task))

    def _task_done(self, task: int) -> None:
        try:
            self._open_tasks.discard(task)
            if not self._open_tasks:
                self._viewed.clear()
            if not self._open_tasks and self.active:  # the outermost backward pass ended
                self._on_pass_end()
        except Exception as e:
            self.on_error(e)

    def remove_leaf_hooks(self) -> None:
        for _, _, handle in self._leaves.values():
            handle.remove()
        self._leaves.clear()


def output_calls(node: Any) -> list[Any]:
    """The calls whose outputs ``node`` made, as any ``GradHooks`` registered them on it (the
    core's handles, innermost call first: a child's forward returns before its parent's);
    empty for a node no call's output came from."""
    calls: list[Any] = []
    for dispatch in node.metadata.values():
        if type(dispatch) is _NodeDispatch:
            calls.extend(dispatch[k + 1] for k in range(0, len(dispatch), 4)
                         if dispatch[k + 2] >= 0)
    return calls

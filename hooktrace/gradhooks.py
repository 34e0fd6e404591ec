"""Gradient hooks on the autograd graph, and the end of each backward pass.

One prehook per autograd node (kept in ``node.metadata``), shared by every module call that has
a tensor made by that node: it calls their callbacks latest-registered first, so a parent's
backward starts before its last child's (hooks on one node would run in registration order).
A leaf tensor has no node: it gets a plain tensor hook, removed when the pass ends.

The first gradient seen in an autograd graph task queues an engine callback; when the outermost
task ends (nested ones come from reentrant checkpointing), ``on_pass_end`` runs: one call per
backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.variable import Variable

GradCallback = Callable[[Any, int, torch.Tensor], None]  # (call, tensor index, gradient)

_MAX_LEAF_HANDLES = 4096  # leaf hooks outlive a step when no backward comes: bound them


class _NodeDispatch:
    __slots__ = ("hooks", "callbacks")

    def __init__(self, hooks: GradHooks) -> None:
        self.hooks = hooks
        self.callbacks: list[tuple[GradCallback, int, Any, int]] = []

    def __call__(self, grad_outputs: Sequence[torch.Tensor | None]) -> None:
        hooks = self.hooks
        if not hooks.active:
            return None
        try:
            hooks.activity()
            for callback, output_nr, call, index in reversed(self.callbacks):
                grad = grad_outputs[output_nr]
                if grad is not None:
                    callback(call, index, grad)
        except Exception as e:  # never break the user's backward
            hooks.on_error(e)
        return None


class GradHooks:
    def __init__(self, on_pass_end: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.active = True
        self.on_error = on_error
        self._on_pass_end = on_pass_end
        self._open_tasks: set[int] = set()
        self._leaf_handles: list[Any] = []

    @property
    def in_backward(self) -> bool:
        return bool(self._open_tasks)

    def attach(self, t: torch.Tensor, callback: GradCallback | None = None, call: Any = None,
               index: int = 0) -> None:
        """Call ``callback(call, index, grad)`` when ``t`` receives its gradient; with no
        callback, only follow the backward pass (for its end)."""
        node = t.grad_fn
        if node is None:
            if callback is not None:
                self._attach_leaf(t, callback, call, index)
            return
        metadata: dict[Any, Any] = node.metadata  # type: ignore[assignment]  # a dict at runtime
        dispatch = metadata.get(self)
        if dispatch is None:
            dispatch = metadata[self] = _NodeDispatch(self)
            node.register_prehook(dispatch)
        if callback is not None:
            dispatch.callbacks.append((callback, t.output_nr, call, index))

    def _attach_leaf(self, t: torch.Tensor, callback: GradCallback, call: Any,
                     index: int) -> None:
        def on_grad(grad: torch.Tensor) -> None:
            if self.active:
                try:
                    self.activity()
                    callback(call, index, grad)
                except Exception as e:
                    self.on_error(e)

        self._leaf_handles.append(t.register_hook(on_grad))  # type: ignore[no-untyped-call]
        if len(self._leaf_handles) > _MAX_LEAF_HANDLES:
            self.remove_leaf_hooks(_MAX_LEAF_HANDLES // 2)

    def activity(self) -> None:
        task = torch._C._current_graph_task_id()
        if task not in self._open_tasks:
            self._open_tasks.add(task)
            Variable._execution_engine.queue_callback(lambda: self._task_done(task))

    def _task_done(self, task: int) -> None:
        try:
            self._open_tasks.discard(task)
            if not self._open_tasks and self.active:  # the outermost backward pass ended
                self._on_pass_end()
        except Exception as e:
            self.on_error(e)

    def remove_leaf_hooks(self, count: int | None = None) -> None:
        handles = self._leaf_handles[:count] if count else self._leaf_handles
        for handle in handles:
            handle.remove()
        del self._leaf_handles[: len(handles)]

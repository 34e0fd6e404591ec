"""The hook core: follows the three moments of a training step (every module call, forward
and backward; the end of a backward pass, ``passes``; an optimizer step, ``stepping``) and
hands each to observers, in order, as an immutable record (``records.Observer``).

Technique (PyTorch's ModuleTracker's, docs/architecture.md): global forward pre/post hooks; for
the backward, gradient hooks (``gradhooks``) on the nodes that made a call's output tensors (its
backward starts when one first gets gradient) and input tensors (grad_input; hooked in the
pre-hook: an in-place module replaces its input's node). Full module backward hooks break
in-place ops (ReLU(inplace=True)). An engine callback at a backward pass's end ends the step.
Of logs the core knows ``--max-events`` and write errors only; in recorded steps a forward end
names the calls that made its inputs (``dataflow``). Each record carries the step's ``Mode``
(``step_mode`` decides): a watched step follows the backward of model calls only (unless
``--break-on nan``): a hook per call's tensors is most of what tracing costs. ``seq`` numbers
the recorded forward ends and backward starts. An observer may raise ``NonFiniteError`` into
the program (``--break-on nan``); another exception stops tracing with one line on stderr,
the program goes on (``--strict``: write errors raise).
"""

from __future__ import annotations

import os
import threading
import weakref
from bdb import BdbQuit
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from hooktrace.hooks.naming import ModInfo, Naming
from hooktrace.hooks.opzoom import OpZoom
from hooktrace.hooks.passes import OFF, RECORDED, WATCHED, CallHandle, Passes
from hooktrace.hooks.records import (
    ForwardEnd,
    ForwardStart,
    Mode,
    Observer,
    per_mode,
    wanting,
)
from hooktrace.hooks.stepping import StepHooks
from hooktrace.hooks.tensors import leaves, summarize
from hooktrace.log.errors import LogWriteError, NonFiniteError
from hooktrace.log.options import TraceOptions

_is_compiling = torch.compiler.is_compiling
_graph_task = torch._C._current_graph_task_id
_version = attrgetter("_version")
_NO_LEAVES: tuple[list[torch.Tensor], int] = ([], 0)  # never appended to
_NO_SUMMARY: tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] = ((), ())


class _Local(threading.local):
    def __init__(self) -> None:
        # module calls running in this thread: (module, info, start or None, call or None, grad)
        self.stack: list[tuple[nn.Module, ModInfo, ForwardStart | None, CallHandle | None,
                               bool]] = []


_live: weakref.WeakSet[CallTracker] = weakref.WeakSet()


def _stop_in_forked_child() -> None:
    for tracker in list(_live):  # a DataLoader worker must not record into the parent's log
        tracker.active = tracker._grads.active = False


os.register_at_fork(after_in_child=_stop_in_forked_child)


class CallTracker(Passes):
    """Follows the module calls of every model (or of the ones ``naming`` is scoped to), the
    ends of backward passes (``Passes``) and the optimizers' steps."""

    def __init__(self, options: TraceOptions) -> None:
        super().__init__(options)
        self._local = _Local()
        self._handles: list[Any] = []
        self._seen: set[ModInfo] = set()
        # the modes whose every call's backward is followed; a watched step, its model calls'
        # only (their backward's start and gradient, the pass's end), unless --break-on nan
        every_backward = {RECORDED, WATCHED} if options.break_on_nan else {RECORDED}
        self._every_backward = [mode in every_backward for mode in Mode]  # indexed by mode
        self._naming: Naming | None = None
        self._observers: list[Observer] = []
        self.zoom = OpZoom(self.fail)  # the op-level zoom into chosen calls: zooms none until told
        self._steps = StepHooks()

    def start(self, naming: Naming, observers: Sequence[Observer]) -> CallTracker:
        self._naming = naming
        self._observers = list(observers)
        for name in ("module_seen", "model_call", "backward_end"):
            setattr(self, f"_to_{name}", wanting(observers, name))
        for name in ("forward_start", "forward_end", "backward_start", "grad_output",
                     "grad_input"):
            setattr(self, f"_to_{name}", per_mode(observers, name))
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, with_kwargs=True,
                                                                always_call=True)]
        self._steps.start(observers)
        self.active = True
        _live.add(self)
        return self

    def stop(self) -> None:
        """Remove every hook, then let the observers finish. Safe to call twice."""
        self.active = self._grads.active = False
        self._remove_hooks()
        self._flow.clear()
        self._steps.stop()
        for observer in self._observers:
            try:
                observer.stop(self.step, self.mode)
            except LogWriteError:
                raise
            except Exception as e:  # the other observers still finish
                self.fail(e)
        _live.discard(self)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
            # torch's handle leaves this entry behind; a stale one makes torch.compile warn
            nn_module._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles.clear()
        self._grads.remove_leaf_hooks()

    # -- forward ---------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if _is_compiling() or not self.active:  # inside torch.compile: stay out of the graph
            return None
        try:
            stack = self._local.stack
            assert self._naming is not None
            info = self._naming.lookup(module, stack[-1][1] if stack else None)
            if info is None:  # not traced (torch.compile's wrapper: its model is, inside it)
                return None
            if self._to_module_seen and info not in self._seen:
                self._seen.add(info)
                for see in self._to_module_seen:
                    see(module, info)
            if not stack:
                for model_call in self._to_model_call:
                    model_call(module, info, self.step)
            grad = torch.is_grad_enabled()
            start = call = None
            mode = self.mode
            if info.traced:
                if self.dropped:
                    self.dropped += 1  # past --max-events: a forward event not written
                if mode:
                    start, call = self._start_forward(module, info, mode, grad, args)
            stack.append((module, info, start, call, grad))
            if self.zoom.depth or (info in self.zoom.chosen and mode is RECORDED):
                self.zoom.enter(module, info, call, args)
        except NonFiniteError:
            raise
        except Exception as e:
            self.fail(e)
        return None

    def _start_forward(self, module: nn.Module, info: ModInfo, mode: Mode, grad: bool,
                       args: tuple[Any, ...]) -> tuple[ForwardStart, CallHandle]:
        # inputs where each call's backward is followed (recorded; watched with --break-on nan)
        each = self._every_backward[mode]
        inputs, seen = leaves(args) if each else _NO_LEAVES
        call = CallHandle(self.step)
        recorded = mode is RECORDED
        start = ForwardStart(module, info, self.step, mode, grad, inputs, seen - len(inputs),
                             summarize(inputs) if recorded else _NO_SUMMARY,
                             tuple(map(_version, inputs)) if grad and recorded else (),
                             self._flow.start(inputs) if recorded else None,
                             module.training if recorded else True)
        for forward_start in self._to_forward_start[mode]:
            forward_start(start)
        if grad and each:
            attach = self._grads.attach
            for i, t in enumerate(inputs):
                if t.requires_grad:
                    attach(t, call, ~i)
        return start, call

    def _post(self, module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        if self.zoom.depth:  # first: its mode is off before the hooks' own work
            self.zoom.leave(module, rest)
        if _is_compiling() or not self.active:
            return None
        try:
            stack = self._local.stack
            if not stack or stack[-1][0] is not module:
                if not any(frame[0] is module for frame in stack):
                    return None  # not pushed: a wrapper, or a module outside the traced models
                while stack[-1][0] is not module:  # calls that ended without a post-hook
                    stack.pop()
            _, _, start, call, grad = stack.pop()
            if len(rest) != 2:  # forward raised: always_call hooks get no kwargs and no output
                if not stack:  # a model call: the follower goes with it, as at its end
                    self._flow.raised()
                return None
            kwargs, output = rest
            if start is not None and call is not None:
                self._end_forward(start, call, args, kwargs, output, not stack)
            elif grad and not stack:
                # not recorded, yet top-level: its outputs still tell when a backward pass ends
                for t in leaves(output)[0]:
                    if t.requires_grad and t.grad_fn is not None:
                        self._grads.attach(t)
        except (NonFiniteError, BdbQuit):
            raise  # --break-on nan: stopping the program is what the user asked for (pdb's q)
        except Exception as e:
            self.fail(e)

    def _end_forward(self, start: ForwardStart, call: CallHandle, args: tuple[Any, ...],
                     kwargs: dict[str, Any], output: Any, top: bool) -> None:
        info = start.info
        kw_inputs, kw_seen = (leaves(kwargs) if kwargs and self._every_backward[start.mode]
                              else _NO_LEAVES)
        outputs, n_out = leaves(output)
        recompute = _graph_task() != -1
        calls = self._recomputed if recompute else self._calls
        index = calls.get(info, 0)
        calls[info] = index + 1
        mode = self.mode
        seq = -1
        if mode is RECORDED:
            seq = next(self._seq)  # atomic under the GIL: backward may run in another thread
            if not self._take_event():
                return
        elif mode is OFF:
            return
        elif self.dropped and start.grad and any(t.requires_grad for t in outputs):
            self.dropped += 1  # past --max-events: its backward event, not written either
        n_args = len(start.inputs)
        call.step, call.seq, call.index, call.recompute = self.step, seq, index, recompute
        call.n_in, call.n_out, call.info = n_args + len(kw_inputs), len(outputs), info
        record = call.record()
        flow = self._flow.end(start.sources, kw_inputs, outputs, seq, top) if seq >= 0 else ()
        end = ForwardEnd(start, record, args, kwargs, output, kw_inputs,
                         kw_seen - len(kw_inputs), outputs, n_out - len(outputs), mode,
                         self._grads.in_backward, top, *flow)
        for forward_end in self._to_forward_end[mode]:
            forward_end(end)
        each = self._every_backward[mode]
        if start.grad and (top or each):
            attach = self._grads.attach
            if each:
                for j, t in enumerate(kw_inputs):
                    if t.requires_grad:
                        attach(t, call, ~(n_args + j))
            for i, t in enumerate(outputs):
                if t.requires_grad:
                    attach(t, call, i)

    _to_module_seen: list[Callable[[nn.Module, ModInfo], None]]
    _to_model_call: list[Callable[[nn.Module, ModInfo, int], None]]
    _to_forward_start: list[list[Callable[[ForwardStart], None]]]
    _to_forward_end: list[list[Callable[[ForwardEnd], None]]]

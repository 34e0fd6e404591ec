"""Hooks every module call, pairs each backward with its forward call, and emits records.

Technique (PyTorch's ModuleTracker's, see DESIGN.md): global forward pre/post hooks, and for the
backward, gradient hooks (``gradhooks``) on the autograd nodes that made a call's output tensors
(its backward starts when one of them first receives gradient) and input tensors (its
grad_input). Full module backward hooks are never used: they break in-place ops (ResNet's
ReLU(inplace=True)).

* Input hooks are registered in the pre-hook, before the module runs: an in-place module
  replaces its input's node, and the old node still yields the gradient of the old value.
* A backward event takes its ``seq`` when it starts; events of a backward pass are buffered and
  written in ``seq`` order when the pass ends (an engine callback), which also closes the step.
* The tracer never raises into the user's program: an internal error (or a log it cannot
  write) is reported once on stderr and tracing stops; the script goes on. The exceptions are
  the ones asked for: ``--break-on nan`` (NonFiniteError) and ``--strict`` (LogWriteError).
* Steps outside ``--steps`` are watched (``watch``): the same hooks and statistics, and only
  anomaly records written.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from hooktrace import schema
from hooktrace.capture import Capture
from hooktrace.errors import LogWriteError, NonFiniteError
from hooktrace.gradhooks import GradHooks
from hooktrace.naming import ModInfo, Naming
from hooktrace.options import TraceOptions
from hooktrace.stats import Stats
from hooktrace.tensors import leaves, shape_of, summarize
from hooktrace.watch import Watch

_is_compiling = torch.compiler.is_compiling
_NO_TENSORS: tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] = ((), ())
_MAX_PENDING = 8192  # events held for deferred statistics before a forced write (no backward)


class Sink(Protocol):
    def write(self, record: Any) -> None: ...
    def flush(self) -> None: ...


class _Call:
    """One recorded module call, waiting for its backward."""

    __slots__ = ("info", "fwd", "step", "call", "n_in", "n_out", "recompute", "bwd", "inputs",
                 "more", "saved")

    def __init__(self, info: ModInfo, inputs: list[torch.Tensor], seen: int) -> None:
        self.info = info
        self.n_in = len(inputs)
        self.more = seen - len(inputs)  # tensor leaves past MAX_LEAVES: counted, not listed
        self.inputs = summarize(inputs)  # shapes as the call began (an in-place op may change them)
        self.n_out = 0
        self.fwd = self.step = self.call = -1
        self.recompute = False
        self.bwd: schema.BackwardEvent | None = None
        self.saved: dict[str, list[torch.Tensor | None]] | None = None  # --capture


class _Local(threading.local):
    def __init__(self) -> None:
        # frames of the module calls running in this thread: (module, info, call or None, grad on)
        self.stack: list[tuple[nn.Module, ModInfo, _Call | None, bool]] = []


_live_tracers: weakref.WeakSet[Tracer] = weakref.WeakSet()


def _stop_in_forked_child() -> None:
    for tracer in list(_live_tracers):  # a DataLoader worker must not record into the parent's log
        tracer._active = tracer._grads.active = False


os.register_at_fork(after_in_child=_stop_in_forked_child)


class Tracer:
    """Records every module call of every model (or of ``models`` only) into ``sink``."""

    def __init__(
        self,
        sink: Sink,
        options: TraceOptions | None = None,
        models: Sequence[nn.Module] | None = None,
        capture: Capture | None = None,
    ) -> None:
        self._sink = sink
        self._options = options or TraceOptions()
        self._models = models
        self._local = _Local()
        self._handles: list[Any] = []
        self._grads = GradHooks(self._on_grad, self._end_step, self._fail)
        self._active = False
        self._pending: list[schema.ForwardEvent | schema.BackwardEvent] = []
        # calls of each module in this step, and of recomputations (activation checkpointing)
        self._calls: dict[ModInfo, int] = {}
        self._recomputed: dict[ModInfo, int] = {}
        self._seq = itertools.count(1)
        self._step = 0
        self._step_counts = [0, 0]  # forward, backward events recorded in the current step
        self.events = 0
        self.dropped = 0
        self.error: str | None = None
        self._stats = Stats(self._options.break_on_nan) if self._options.stats else None
        self._break_on_nan = self._options.break_on_nan and self._stats is not None
        self._watch = Watch() if self._stats is not None and self._options.watch else None
        self._recording = 0 in self._options.steps
        self._watching = not self._recording and self._watch is not None
        self._naming: Naming | None = None
        self._capture = capture
        self._capture_match: dict[ModInfo, bool] = {}
        self._captured: list[_Call] = []  # calls holding gradients to save when the pass ends
        self._in_pass: list[_Call] = []  # calls with a backward event in this pass
        self._compiled_noted = False
        self._step_params: dict[ModInfo, None] = {}  # modules with parameters in this step
        self._last_checked: list[tuple[weakref.ref[torch.Tensor], int]] = []

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Backward passes completed while tracing."""
        return self._step

    def start(self) -> Tracer:
        self._naming = Naming(self._sink.write, self._options.matches, self._models)
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]
        self._active = True
        _live_tracers.add(self)
        return self

    def stop(self) -> None:
        """Remove every hook and write what is buffered. Safe to call twice."""
        self._active = self._grads.active = False
        self._remove_hooks()
        if self._pending:  # a backward that never finished (it raised, or we stop inside it)
            self._write_pending()
        if self._watching and self._watch is not None and self._stats is not None:
            try:
                self._stats.resolve()  # a NaN seen in a step that never reached its backward
            except Exception as e:
                self._fail(e)
            for anomaly in self._watch.end_step(self._step):
                self._sink.write(anomaly)
        self._sink.flush()
        _live_tracers.discard(self)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
            # torch's handle leaves this entry behind; a stale one makes torch.compile warn
            nn_module._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles.clear()
        self._grads.remove_leaf_hooks()

    def _fail(self, error: BaseException) -> None:
        """Stop tracing, say why once; the program goes on (with --strict, a failed log write
        is raised into it instead)."""
        first = self.error is None
        self._active = self._grads.active = False
        if isinstance(error, LogWriteError):
            if first:
                self.error = str(error)
                print(f"hooktrace: {error}; tracing stopped (your script goes on)",
                      file=sys.stderr)
            if self._options.strict:
                raise error
            return
        if first:
            self.error = f"{type(error).__name__}: {error}"
            print(f"hooktrace: internal error, tracing stopped (your script goes on): "
                  f"{self.error}", file=sys.stderr)

    # -- forward ---------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if _is_compiling() or not self._active:  # inside torch.compile: stay out of the graph
            return None
        try:
            stack = self._local.stack
            assert self._naming is not None
            info = self._naming.lookup(module, stack[-1][1] if stack else None)
            if info is None:
                if type(module).__name__ == "OptimizedModule" and not self._compiled_noted:
                    self._compiled_noted = True
                    print("hooktrace: a torch.compile'd model runs compiled code without module "
                          "hooks; to trace it, run eagerly (TORCHDYNAMO_DISABLE=1)",
                          file=sys.stderr)
                return None
            if self.dropped and info.traced:
                self.dropped += 1  # past --max-events: a forward event not written
            grad = torch.is_grad_enabled()
            call = None
            if (self._recording or self._watching) and info.traced:
                inputs, seen = leaves(args)
                call = _Call(info, inputs, seen)
                call.step = self._step
                if self._capture is not None and self._recording and self._captures(info):
                    call.saved = {"inputs": list(inputs)}  # before an in-place op changes them
                if grad:
                    for i, t in enumerate(inputs):
                        if t.requires_grad:
                            self._grads.attach(t, call, ~i)
            stack.append((module, info, call, grad))
        except Exception as e:
            self._fail(e)
        return None

    def _post(self, module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        if _is_compiling() or not self._active:
            return None
        stop = None
        try:
            stack = self._local.stack
            if not stack or stack[-1][0] is not module:
                if not any(frame[0] is module for frame in stack):
                    return None  # not pushed: a wrapper, or a module outside the traced models
                while stack[-1][0] is not module:  # calls that ended without a post-hook
                    stack.pop()
            frame = stack.pop()
            if len(rest) != 2:  # forward raised: always_call hooks get no kwargs and no output
                return None
            kwargs, output = rest
            _, info, call, grad = frame
            if call is not None:
                found = self._record_forward(call, info, grad, kwargs, output)
                if found and self._break_on_nan:
                    self._break_on_nan = False
                    stop = (module, info, args, kwargs, output, found)
            elif grad and not stack:
                # not recorded, yet top-level: its outputs still tell when a backward pass ends
                for t in leaves(output)[0]:
                    if t.requires_grad and t.grad_fn is not None:
                        self._grads.attach(t)
        except Exception as e:
            self._fail(e)
            return None
        if stop is not None:
            _break_nonfinite(self._step, *stop)  # outside the try: meant to reach the program
        return None

    def _record_forward(self, call: _Call, info: ModInfo, grad: bool, kwargs: dict[str, Any],
                        output: Any) -> list[list[int]] | None:
        """Write the call's forward event (or watch it); return its NaN/Inf outputs."""
        in_shapes, in_dtypes = call.inputs
        call.inputs = _NO_TENSORS  # what outlives the forward call, the fewer objects the better
        kw_inputs, kw_seen = leaves(kwargs) if kwargs else ([], 0)
        if kw_inputs:
            kw_shapes, kw_dtypes = summarize(kw_inputs)
            in_shapes, in_dtypes = in_shapes + kw_shapes, in_dtypes + kw_dtypes
        outputs, n_out = leaves(output)
        out_shapes, out_dtypes = summarize(outputs)
        recompute = torch._C._current_graph_task_id() != -1
        calls = self._recomputed if recompute else self._calls
        index = calls.get(info, 0)
        calls[info] = index + 1
        if not self._recording:
            return self._watch_forward(call, info, grad, index, recompute, kw_inputs, outputs)
        seq = next(self._seq)  # atomic under the GIL: backward may run in another thread
        if not self._count_event(0):
            return None
        if info.has_params:
            self._step_params[info] = None
        n_args = call.n_in
        call.fwd, call.step, call.call, call.recompute = seq, self._step, index, recompute
        call.n_in = n_args + len(kw_inputs)
        call.n_out = len(outputs)
        event = schema.ForwardEvent(
            seq, self._step, info.model, info.name, index, in_shapes, in_dtypes, out_shapes,
            out_dtypes, no_grad=not grad, recompute=recompute,
            inputs_more=(call.more + kw_seen - len(kw_inputs)) or None,
            outputs_more=(n_out - len(outputs)) or None,
        )
        if self._stats is not None:
            event.output_nonfinite = self._check_outputs(outputs)
        self._emit(event)
        if call.saved is not None and self._capture is not None:
            self._capture.save(self._step, info.name, index, "forward", {
                "inputs": [*call.saved["inputs"], *kw_inputs], "outputs": list(outputs)})
            call.saved = {"grad_inputs": [None] * call.n_in, "grad_outputs": [None] * call.n_out}
        if grad:
            self._attach_grads(call, n_args, kw_inputs, outputs)
        return event.output_nonfinite

    def _watch_forward(self, call: _Call, info: ModInfo, grad: bool, index: int,
                       recompute: bool, kw_inputs: list[torch.Tensor],
                       outputs: list[torch.Tensor]) -> list[list[int]]:
        """A watched step: no event, but the same checks and gradient hooks."""
        assert self._watch is not None
        call.step, call.call, call.recompute = self._step, index, recompute
        n_args = call.n_in
        call.n_in, call.n_out = n_args + len(kw_inputs), len(outputs)
        found = self._check_outputs(outputs)
        assert self._stats is not None
        if found or self._stats.deferred:  # else nothing to hold: all outputs were finite
            self._watch.forward(info, index, found)
        if self._watch.full and not self._grads.in_backward:
            self._stats.resolve()
            for anomaly in self._watch.forward_anomalies(self._step):
                self._sink.write(anomaly)
        if grad:
            if info.has_params:
                self._watch.param_call(info, index, self._step, call)
            self._attach_grads(call, n_args, kw_inputs, outputs)
        return found

    def _attach_grads(self, call: _Call, n_args: int, kw_inputs: list[torch.Tensor],
                      outputs: list[torch.Tensor]) -> None:
        for j, t in enumerate(kw_inputs):
            if t.requires_grad:
                self._grads.attach(t, call, ~(n_args + j))
        for i, t in enumerate(outputs):
            if t.requires_grad:
                self._grads.attach(t, call, i)

    def _check_outputs(self, outputs: list[torch.Tensor]) -> list[list[int]]:
        """NaN/Inf in the outputs; a tensor just checked (a parent returning its last child's
        output) is not checked twice."""
        assert self._stats is not None
        found: list[list[int]] = []
        last = self._last_checked
        checked = []
        for i, t in enumerate(outputs):
            try:
                version = t._version
            except RuntimeError:  # an inference-mode tensor has no version counter
                version = -1
            if not any(ref() is t and v == version for ref, v in last):
                self._stats.nonfinite(t, found, i)
            checked.append((weakref.ref(t), version))
        self._last_checked = checked
        return found

    # -- backward --------------------------------------------------------------------------
    def _on_grad(self, call: _Call, index: int, grad: torch.Tensor) -> None:
        if index >= 0:
            self._on_grad_output(call, index, grad)
        else:
            self._on_grad_input(call, ~index, grad)

    def _on_grad_output(self, call: _Call, index: int, grad: torch.Tensor) -> None:
        bwd = call.bwd
        if bwd is None or bwd.step != self._step:  # first gradient of this pass: backward starts
            if self._recording:
                if not self._count_event(1):
                    return
                seq = next(self._seq)
            elif self._watching:
                seq = 0  # a watched step writes no event
                if self.dropped:
                    self.dropped += 1  # past --max-events: a backward event not written
            else:
                return
            info = call.info
            n_in, n_out = call.n_in, call.n_out
            stats = self._stats is not None
            bwd = call.bwd = schema.BackwardEvent(
                seq, self._step, info.model, info.name, call.call, call.fwd, n_in, n_out,
                [None] * n_in, [None] * n_out, call.recompute,
                [None] * n_in if stats else None, [None] * n_out if stats else None)
            if info.has_params:
                self._step_params[info] = None
            if self._watch is not None:
                self._watch.had_grad.add(info)
            if self._recording:
                self._pending.append(bwd)
                self._in_pass.append(call)
                if call.saved is not None:
                    self._captured.append(call)
            elif self._watch is not None:
                self._watch.backward(bwd)
        bwd.grad_output_shapes[index] = shape_of(grad)
        if call.saved is not None:
            call.saved["grad_outputs"][index] = grad.detach().to("cpu", copy=True)
        if bwd.grad_output_stats is not None and self._stats is not None:
            self._stats.grad(grad, bwd.grad_output_stats, index, bwd.seq > 0)

    def _on_grad_input(self, call: _Call, index: int, grad: torch.Tensor) -> None:
        bwd = call.bwd
        if bwd is not None and bwd.step == self._step:
            bwd.grad_input_shapes[index] = shape_of(grad)
            if call.saved is not None:
                call.saved["grad_inputs"][index] = grad.detach().to("cpu", copy=True)
            if bwd.grad_input_stats is not None and self._stats is not None:
                self._stats.grad(grad, bwd.grad_input_stats, index, bwd.seq > 0)
                if self._break_on_nan and _produced_nonfinite(bwd, index):
                    self._break_on_nan = False
                    raise NonFiniteError(
                        f"hooktrace --break-on nan: the backward of {info_label(call.info)} "
                        f"produced a NaN/Inf gradient for its input {index} at step {self._step}")

    def _end_step(self) -> None:
        if self._stats is not None:
            self._stats.end_pass()
        self._save_captured()
        params = self._param_grads() if self._recording else []
        self._write_pending()
        for call in self._in_pass:
            call.bwd = None  # written: let it go now, not when the graph is freed (a step later)
        self._in_pass.clear()
        for record in params:
            self._sink.write(record)
        if self._watching and self._watch is not None:
            for anomaly in self._watch.end_step(self._step):
                self._sink.write(anomaly)
        if self._recording or self._step_counts != [0, 0]:  # also the step the cap cut short
            forward, backward = self._step_counts
            self._sink.write(schema.Step(self._step, forward, backward))
        self._sink.flush()
        self._step += 1
        # a graph may be backpropagated again (retain_graph, a gradient penalty): keep the
        # previous step's calls listening on leaf inputs, forget older ones
        self._grads.prune_leaf_hooks(lambda call: call.step >= self._step - 1)
        self._step_counts = [0, 0]
        self._calls.clear()
        self._recomputed.clear()
        self._step_params.clear()
        self._last_checked = []
        self._recording = self._step in self._options.steps and self.dropped == 0
        self._watching = not self._recording and self._watch is not None
        last = self._options.steps.last
        if last is not None and self._step > last and self._watch is None:
            self._remove_hooks()  # nothing more to record: the rest of the run pays nothing

    def _captures(self, info: ModInfo) -> bool:
        match = self._capture_match.get(info)
        if match is None:
            assert self._capture is not None
            match = self._capture_match[info] = self._capture.matches(info.name)
        return match

    def _save_captured(self) -> None:
        captured, self._captured = self._captured, []
        for call in captured:
            if call.saved is not None and self._capture is not None:
                self._capture.save(self._step, call.info.name, call.call, "backward", call.saved)
                call.saved = None

    def _param_grads(self) -> list[schema.ParamGrads]:
        """Norms of the parameter gradients of the modules that took part in this step; and of
        modules never called so far whose parameters got a gradient anyway (a parent uses them
        directly, as MultiheadAttention does its out_proj's): not unused, though never called.
        Without statistics, only the latter (a rare few, read at once)."""
        assert self._naming is not None
        uncalled = self._naming.uncalled
        if uncalled:
            for info in self._step_params:
                uncalled.pop(info, None)
            for info in [info for info in uncalled if info.ref() is None]:
                del uncalled[info]  # its model is gone
        if self._stats is None and not uncalled:
            return []
        records: dict[int, schema.ParamGrads] = {}
        groups: list[tuple[dict[str, Any], str, list[torch.Tensor]]] = []
        called = self._step_params if self._stats is not None else ()
        for info in itertools.chain(called, uncalled):
            module = info.ref()
            if module is None:
                continue
            # _parameters, not parameters(recurse=False): the generator costs more than the norm
            trainable = [p for p in module._parameters.values()
                         if p is not None and p.requires_grad]
            if not trainable:
                continue  # frozen: the module record says so
            grads = [p.grad for p in trainable if p.grad is not None]
            if not grads and info in uncalled:
                continue  # not called, no gradient: unused, as the module records tell
            record = records.get(info.model)
            if record is None:
                record = records[info.model] = schema.ParamGrads(self._step, info.model)
            groups.append((record.grad_norm, info.name, grads))
        (self._stats or Stats(immediate=True)).param_norms(groups)
        return [records[m] for m in sorted(records)]

    # -- output ----------------------------------------------------------------------------
    def _count_event(self, phase: int) -> bool:
        if self.events >= self._options.max_events:
            if self.dropped == 0:
                print(f"hooktrace: --max-events {self._options.max_events} reached at step "
                      f"{self._step}; recording stopped, the log stays valid", file=sys.stderr)
            self.dropped += 1
            self._recording = False
            self._watching = self._watch is not None
            return False
        self.events += 1
        self._step_counts[phase] += 1
        return True

    def _emit(self, event: schema.ForwardEvent | schema.BackwardEvent) -> None:
        # inside backward, or while statistics wait for the device: held, then written in seq order
        deferred = self._stats is not None and self._stats.deferred
        if self._grads.in_backward or self._pending or deferred:
            self._pending.append(event)
            if len(self._pending) > _MAX_PENDING and not self._grads.in_backward:
                self._write_pending()  # forward-only code (inference): no backward will come
        else:
            self._sink.write(event)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        if self._stats is not None:
            try:
                self._stats.resolve()
            except Exception as e:  # numbers that cannot be read: the events go without them
                self._fail(e)
        pending.sort(key=lambda e: e.seq)
        for event in pending:
            self._sink.write(event)


def info_label(info: ModInfo) -> str:
    return f"{info.name or '(root)'} ({info.cls})"


def _produced_nonfinite(bwd: schema.BackwardEvent, index: int) -> bool:
    """The grad_input ``index`` is NaN/Inf while every grad_output reaching the call was finite."""
    stat = (bwd.grad_input_stats or [None])[index]
    if stat is None or math.isfinite(stat[0]):
        return False
    return all(s is None or math.isfinite(s[0]) for s in bwd.grad_output_stats or [])


def _break_nonfinite(step: int, module: nn.Module, info: ModInfo, inputs: tuple[Any, ...],
                     kwargs: dict[str, Any], output: Any, found: list[list[int]]) -> None:
    """--break-on nan: open pdb here, with the module and its tensors in reach; without a
    terminal, raise instead."""
    where = ", ".join(f"output {i}: {nan} NaN, {inf} Inf" for i, nan, inf in found)
    message = (f"hooktrace --break-on nan: {info_label(info)} produced NaN/Inf at step {step} "
               f"({where})")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise NonFiniteError(message)
    print(f"{message}\nhooktrace: in reach: module, inputs, kwargs, output; 'c' continues",
          file=sys.stderr)
    import pdb

    pdb.Pdb().set_trace()

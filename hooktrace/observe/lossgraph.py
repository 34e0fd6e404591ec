"""The loss, seen as the root of a backward pass: what a functional loss (``F.cross_entropy``)
and a ``GradScaler`` leave in the autograd graph, which no module call shows.

In a recorded step, ``loss.backward()`` (``torch.autograd.backward``, wrapped while tracing
runs) walks the root's graph breadth first, at most ``_BUDGET`` nodes, stopping at the nodes
that made a traced call's output (the core's gradient hooks mark them). It writes, when they
change, the ops from each loss function back to the model's output (``loss-ops``) and how many
times the scaler's scale multiplies the root (``loss-scaled``). A scaled pass leaves gradients
scaled until ``scaler.unscale_``: the gradients it left, still unchanged when an optimizer
steps or ``clip_grad_norm_`` runs while the scaler has unscaled no optimizer since its last
update (``scaled-step``, ``scaled-clip``), are said once. The graph is only read: no hook is
added to it and no saved tensor is unpacked through a hook (that would re-run a checkpointed
forward).

Cost: nothing per module call; in a watched or off step one mode test per ``backward()``; in a
recorded step a walk of a few nodes (see docs/performance.md). An exception here
never reaches the program: the pass is not described, and the program's call runs as it was.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch.amp.grad_scaler import OptState

from hooktrace.hooks.gradhooks import output_calls
from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.lossscale import find_scaler
from hooktrace.observe.lossvalues import LossValues

_BUDGET = 64  # autograd nodes one walk visits at most
_CHAIN = 12  # nodes followed from a loss's input back to the model's output
_ROOTS = 4  # roots of one backward() call walked
_LOOKS = 16  # recorded passes in which to look for a scaler on the stack
#: ops a loss goes through on its way to backward (a scale, a mean, a sum of losses)
_ARITH = frozenset({"Mul", "Div", "Add", "Sub", "Neg", "Sum", "Mean"})
_graph_task = torch._C._current_graph_task_id
_is_compiling = torch.compiler.is_compiling


class Loss(NamedTuple):
    """A loss function's node, and the path from its input back to a traced call's output."""

    op: str
    ops: tuple[str, ...]  # between the loss and the output, the loss's input first
    out: str  # the op that made the output (below views and casts)
    outer: ModInfo  # the outermost call that returned it
    inner: ModInfo  # the innermost


class _Walk(NamedTuple):
    losses: list[Loss]
    models: set[int]  # the models whose outputs the walk reached
    scales: int  # the most scale multiplications on one path; -1: no scaler known


def op_name(node: Any) -> str:
    name = type(node).__name__
    cut = name.rfind("Backward")
    return name[:cut] if cut > 0 else name


def is_loss(op: str) -> bool:
    return "Loss" in op or op.startswith("BinaryCrossEntropy")


def is_scale(node: Any, ptr: int) -> bool:
    """``node`` multiplies by the tensor at ``ptr`` (a scaler's scale). The saved tensor is read
    without unpacking it: an unpack hook (activation checkpointing) would recompute."""
    if type(node).__name__ != "MulBackward0":
        return False
    saved = node._raw_saved_other
    if saved.unpack_hook is not None:
        return False
    other = saved.data
    return isinstance(other, torch.Tensor) and other.numel() == 1 and other.data_ptr() == ptr


def _outputs(node: Any, trained: set[int]) -> list[ModInfo]:
    """The traced calls of models with parameters whose output ``node`` made (a loss module's
    output is walked through), innermost first."""
    infos = [call.info for call in output_calls(node) if call.info is not None]
    return [info for info in infos if info.model in trained]


def _first_input(node: Any) -> Any:
    edges = node.next_functions
    return edges[0][0] if edges else None


def _chain(loss: Any, trained: set[int]) -> Loss | None:
    """From a loss function's node along its first input (the prediction) to a traced call's
    output, then past views and casts to the op that made it."""
    ops: list[str] = []
    node = _first_input(loss)
    while node is not None and len(ops) < _CHAIN:
        infos = _outputs(node, trained)
        if infos:
            out = op_name(node)
            for _ in range(4):  # a view of a layer's output (a Linear on a 3-d input)
                below = _first_input(node) if out in schema.VIEW_OPS else None
                if below is None:
                    break
                node, out = below, op_name(below)
            inner = next(i for i in infos if i.model == infos[-1].model)
            return Loss(op_name(loss), tuple(ops), out, infos[-1], inner)
        ops.append(op_name(node))
        node = _first_input(node)
    return None


def walk(root: Any, trained: set[int], scale_ptr: int | None) -> _Walk:
    """Breadth first from ``root``, stopping at traced calls' outputs and at leaves. Scale
    multiplications are counted along paths of arithmetic from the root only (a gradient
    penalty's double-backward graph multiplies by the scale too, below the ops it takes)."""
    scaled = scale_ptr is not None
    depth: dict[Any, int | None] = {root: int(scaled and is_scale(root, scale_ptr or 0))}
    queue = deque([root])
    losses: list[Loss] = []
    models: set[int] = set()
    visited = 0
    while queue and visited < _BUDGET:
        node = queue.popleft()
        visited += 1
        infos = _outputs(node, trained)
        if infos:
            models.update(info.model for info in infos)
            continue
        op = op_name(node)
        if is_loss(op):
            found = _chain(node, trained)
            if found is not None:
                losses.append(found)
        d = depth[node]
        d = d if d is not None and op in _ARITH else None
        for child, _ in node.next_functions:
            if child is None or child in depth or type(child).__name__ == "AccumulateGrad":
                continue
            depth[child] = None if d is None else d + int(scaled and is_scale(child,
                                                                               scale_ptr or 0))
            queue.append(child)
    return _Walk(losses, models, max(n or 0 for n in depth.values()) if scaled else -1)


def _roots(tensors: Any) -> list[Any]:
    """The nodes of ``backward()``'s tensors: of a tensor, a list or a tuple only (an iterator
    read here would reach backward used up)."""
    many = [tensors] if isinstance(tensors, torch.Tensor) else \
        tensors[:_ROOTS] if isinstance(tensors, (list, tuple)) else []
    return [t.grad_fn for t in many if isinstance(t, torch.Tensor) and t.grad_fn is not None]


class LossGraph(Observer):
    """Wraps ``torch.autograd.backward`` and ``torch.nn.utils.clip_grad_norm_`` while tracing
    runs (the program's call goes through unchanged) and holds a global optimizer step
    pre-hook; ``stop`` puts them back."""

    follows = ()  # no module call: first sights and passes only

    def __init__(self, emit: Emit, mode: Callable[[], Mode],
                 returned: Callable[[], Callable[[], None]] = lambda: lambda: None,
                 looked: Callable[[list[Any], set[int]], None] | None = None) -> None:
        self._emit = emit
        self._mode = mode  # the current step's mode
        # called as the outermost backward() begins; what it returns, once it returned
        self._returned = returned
        self._looked = looked  # the roots and the models they reached, once walked
        self._on = True
        self.calls = 0  # backward() calls while tracing ran (with module calls or without)
        self._trained: set[int] = set()  # models with parameters
        self._scaler: weakref.ref[Any] | None = None
        self._looks = 0
        self._pending: list[_Walk] | None = None  # the walks of the pass now running
        self._said_ops: dict[tuple[int, str, str], tuple[Any, ...]] = {}
        self._said_scales: dict[int, int] = {}
        # id(parameter) -> the .grad a scaled recorded pass left, its version then, the
        # parameter's module and the step
        self._scaled: dict[int, tuple[weakref.ref[torch.Tensor], int, ModInfo, int]] = {}
        self._said_steps: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._said_clip = False
        self.values = LossValues(emit)
        self._backward = torch.autograd.backward
        self._clip = torch.nn.utils.clip_grad_norm_
        self._wrapped_backward = self._wrap_backward(self._backward)
        self._wrapped_clip = self._wrap_clip(self._clip)
        torch.autograd.backward = self._wrapped_backward
        torch.nn.utils.clip_grad_norm_ = self._wrapped_clip

    def module_seen(self, module: torch.nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._trained.add(info.model)

    def stop(self, step: int, mode: Mode) -> None:
        if self._on:
            self.values.write()
        self._on = False
        # another wrapper around ours (a second session) stays; ours then only passes through
        if torch.autograd.backward is self._wrapped_backward:
            torch.autograd.backward = self._backward
        if torch.nn.utils.clip_grad_norm_ is self._wrapped_clip:
            torch.nn.utils.clip_grad_norm_ = self._clip

    # -- backward ----------------------------------------------------------------------------
    def _wrap_backward(self, original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> None:
            self.calls += 1
            outermost = self._on and _graph_task() == -1 and not _is_compiling()
            if outermost:
                self.values.began(tensors)
            if outermost and self._mode() is Mode.RECORDED:
                self._look(tensors)
            then = self._returned() if outermost else None
            try:
                original(tensors, *args, **kwargs)
            finally:
                self._pending = None
            if then is not None:
                then()
        return backward

    def _look(self, tensors: Any) -> None:
        roots: list[Any] = []
        try:
            scaler = self._find_scaler()
            scale = getattr(scaler, "_scale", None) if scaler is not None else None
            ptr = scale.data_ptr() if isinstance(scale, torch.Tensor) else None
            roots = _roots(tensors)
            self._pending = [walk(root, self._trained, ptr) for root in roots]
        except Exception:  # an odd graph: this pass is not described
            self._pending = None
        if self._looked is not None:  # the loss terms' window closes, walked or not
            self._looked(roots if self._pending is not None else [],
                         {m for w in self._pending or [] for m in w.models})

    def _find_scaler(self) -> Any:
        scaler = self._scaler() if self._scaler is not None else None
        if scaler is not None or self._looks >= _LOOKS:
            return scaler
        self._looks += 1
        scaler = find_scaler(sys._getframe(2))
        if scaler is not None:
            self._scaler = weakref.ref(scaler)
        return scaler

    def backward_end(self, end: PassEnd) -> None:
        if self._on:
            self.values.ended(end)
        walks, self._pending = self._pending, None
        if end.mode is not Mode.RECORDED:
            if self._scaled:
                self._scaled.clear()  # past the recorded steps: optimizer steps pay nothing
            return
        if not walks or not self._on:
            return
        try:
            self._write(end.step, walks)
            if any(w.scales > 0 for w in walks):
                self._remember(end)
        except Exception:
            self._on = False  # said nowhere: the other observers go on

    def _write(self, step: int, walks: list[_Walk]) -> None:
        for loss in sorted({loss for w in walks for loss in w.losses},
                           key=lambda x: (x.outer.model, x.outer.fqn, x.op)):
            key = (loss.outer.model, loss.outer.fqn, loss.op)
            said = (loss.ops, loss.out, loss.inner.fqn)
            if self._said_ops.get(key) != said:
                self._said_ops[key] = said
                detail: dict[str, Any] = {"loss": loss.op, "ops": list(loss.ops), "out": loss.out}
                if loss.inner.fqn != loss.outer.fqn:
                    detail["last"] = loss.inner.fqn
                self._emit(schema.Signal(step, loss.outer.model, loss.outer.fqn,
                                         SignalKind.LOSS_OPS, detail))
        times: dict[int, int] = {}
        for w in walks:
            if w.scales >= 0:
                for model in w.models:
                    times[model] = max(times.get(model, 0), w.scales)
        for model, n in sorted(times.items()):
            if self._said_scales.get(model) != n:
                self._said_scales[model] = n
                self._emit(schema.Signal(step, model, "", SignalKind.LOSS_SCALED, {"times": n}))

    def _remember(self, end: PassEnd) -> None:
        """The .grad of the parameters of the modules a scaled pass reached, as it left them."""
        for info in end.reached:
            module = info.ref() if info.has_params else None
            if module is None:
                continue
            for p in module._parameters.values():
                grad = p.grad if p is not None else None
                if grad is not None:
                    self._scaled[id(p)] = (weakref.ref(grad), grad._version, info, end.step)

    def _still_scaled(self, params: Iterable[Any], keep: bool) -> dict[int, list[ModInfo]]:
        """Of ``params``, those whose .grad is as a scaled pass left it, by step (and their
        entries dropped unless ``keep``)."""
        found: dict[int, list[ModInfo]] = {}
        for p in params:
            entry = self._scaled.get(id(p)) if keep else self._scaled.pop(id(p), None)
            grad: Any = getattr(p, "grad", None)
            if entry is not None and grad is not None and grad._version == entry[1] \
                    and entry[0]() is grad:
                found.setdefault(entry[3], []).append(entry[2])
        return found

    def _say(self, kind: str, found: dict[int, list[ModInfo]], detail: dict[str, Any]) -> None:
        step = min(found)
        infos = [info for infos in found.values() for info in infos]
        for model in sorted({info.model for info in infos}):
            names = list(dict.fromkeys(i.fqn for i in infos if i.model == model))
            self._emit(schema.Signal(step, model, "", kind, {**detail, "modules": names}))

    # -- optimizer steps and clipping ------------------------------------------------------
    def optimizer_stepping(self, step: OptimizerStep) -> None:
        if not self._scaled or not self._on:
            return
        optimizer = step.optimizer
        try:
            scaler = self._scaler() if self._scaler is not None else None
            # scaler.step unscales first (an optimizer it wraps, ZeroRedundancyOptimizer's,
            # steps inside it: any optimizer unscaled since the scaler's update counts); an
            # optimizer that unscales itself (fused Adam) is handed optimizer.grad_scale
            unscaled = scaler is None or any(
                state["stage"] is not OptState.READY
                for state in scaler._per_optimizer_states.values()) or getattr(
                    optimizer, "grad_scale", None) is not None
            params = [p for group in optimizer.param_groups for p in group["params"]]
            found = self._still_scaled(params, keep=False)
            if found and not unscaled and optimizer not in self._said_steps:
                self._said_steps.add(optimizer)
                self._say(SignalKind.SCALED_STEP, found, {"optimizer": type(optimizer).__name__})
        except Exception:
            self._on = False

    def _wrap_clip(self, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(original)
        def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self._scaled and self._on and not self._said_clip:
                if not isinstance(parameters, torch.Tensor):
                    parameters = list(parameters)  # what clip_grad_norm_ does first itself
                self._clipping(parameters, args, kwargs)
            return original(parameters, *args, **kwargs)
        return clip_grad_norm_

    def _clipping(self, parameters: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            scaler = self._scaler() if self._scaler is not None else None
            if scaler is None or any(state["stage"] is not OptState.READY
                                     for state in scaler._per_optimizer_states.values()):
                return  # an optimizer was unscaled since the scaler's last update
            params = [parameters] if isinstance(parameters, torch.Tensor) else parameters
            found = self._still_scaled(params, keep=True)
            if found:
                self._said_clip = True
                max_norm = args[0] if args else kwargs.get("max_norm")
                self._say(SignalKind.SCALED_CLIP, found, {"max_norm": float(max_norm or 0)})
        except Exception:
            self._on = False

"""The loss observer: the loss each backward pass starts from, read once from its root as
``backward()`` begins, with what the loss window saw it built from.

While tracing runs it wraps ``torch.autograd.backward``, ``Tensor.backward`` and
``torch.nn.utils.clip_grad_norm_`` (the program's call goes through unchanged) and holds a
global optimizer step pre-hook; ``stop`` puts them back. In recorded steps it writes what one
walk of each root's graph shows (``lossgraph.py``: ``loss-ops``, ``loss-scaled``), what the
loss window saw (``losswindow.py``: ``loss-term-cut`` where the addition lies on the root's
arithmetic top, a term of the loss and not an addition inside a model; ``loss-target-grad``;
``loss-share``, its counts read once as the pass ends) and the scaler's facts
(``lossscale.py``: ``loss-scale``, ``scaled-step``, ``scaled-clip``); in every step, the loss
ledger's values (``lossvalues.py``: ``loss-values`` as tracing stops). A constant that never
had a gradient (an accumulator started at ``torch.zeros(())``, a Python number) cuts nothing.

Cost: nothing per module call but a recorded step's model call's end (it opens the window); in
a watched or off step one mode test per ``backward()``; in a recorded step one Python call per
torch operation in the window (at most ``losswindow.CAP``) and walks of a few dozen nodes (see
docs/performance.md). An exception here never reaches the program: the part it came from goes
quiet (the window, the graph's reads, the ledger, each alone) and the program runs as it was.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, ForwardEnd, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe import lossgraph
from hooktrace.observe.lossgraph import GraphWalk, Share, arithmetic_top, bootstrapped, reads
from hooktrace.observe.lossscale import Scaling
from hooktrace.observe.lossvalues import LossValues
from hooktrace.observe.losswindow import Window

_ROOTS = 4  # roots of one backward() call walked
_graph_task = torch._C._current_graph_task_id
_is_compiling = torch.compiler.is_compiling


def _roots(tensors: Any) -> list[Any]:
    """The nodes of ``backward()``'s tensors: of a tensor, a list or a tuple only (an iterator
    read here would reach backward used up)."""
    many = [tensors] if isinstance(tensors, torch.Tensor) else \
        tensors[:_ROOTS] if isinstance(tensors, (list, tuple)) else []
    return [t.grad_fn for t in many if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _shares_said(step: int, shares: list[tuple[Share, int]]) -> list[schema.Signal]:
    """The ``loss-share`` signals of a pass's shares (and their models): their counts read at
    once, the parts read below the whole, multipliers that are 0/1 masks only."""
    device = shares[0][0].read.device
    counts = torch.stack([torch.stack([s.read.to(device, torch.int64),
                                       s.bad.to(device, torch.int64)])
                          for s, _ in shares]).tolist()  # one read
    return [schema.Signal(step, model, "", SignalKind.LOSS_SHARE,
                          {**s.detail, "read": int(read), "of": s.of})
            for (s, model), (read, bad) in zip(shares, counts, strict=True)
            if read < s.of and not bad]


def _ops_said(step: int, walks: list[GraphWalk], said: dict[Any, Any]) -> list[schema.Signal]:
    """``loss-ops`` of each loss function, ``loss-scaled`` of each model, where changed."""
    out = []
    # walk order breaks ties (a set's order would follow hashes: two runs could differ)
    for loss in sorted(dict.fromkeys(loss for w in walks for loss in w.losses),
                       key=lambda x: (x.outer.model, x.outer.fqn, x.op)):
        key, now = (loss.outer.model, loss.outer.fqn, loss.op), (loss.ops, loss.out,
                                                                 loss.inner.fqn)
        if said.get(key) != now:
            said[key] = now
            detail: dict[str, Any] = {"loss": loss.op, "ops": list(loss.ops), "out": loss.out}
            if loss.inner.fqn != loss.outer.fqn:
                detail["last"] = loss.inner.fqn
            out.append(schema.Signal(step, loss.outer.model, loss.outer.fqn,
                                     SignalKind.LOSS_OPS, detail))
    times: dict[int, int] = {}
    for w in walks:
        for model in w.models if w.scales >= 0 else ():
            times[model] = max(times.get(model, 0), w.scales)
    for model, n in sorted(times.items()):
        if said.get(model) != n:
            said[model] = n
            out.append(schema.Signal(step, model, "", SignalKind.LOSS_SCALED, {"times": n}))
    return out


class LossObserver(Observer):
    """Opens the window as a recorded step's model call returns; reads the loss as an
    outermost ``backward()`` begins; writes at the pass's end."""

    follows = (Mode.RECORDED,)  # module calls: a recorded step's model call's end only

    def __init__(self, emit: Emit, mode: Callable[[], Mode], step: Callable[[], int],
                 returned: Callable[[], Callable[[], None]] = lambda: lambda: None) -> None:
        self._emit = emit
        self._mode, self._step = mode, step  # the current step's
        # called as the outermost backward() begins; what it returns, once it returned
        self._returned = returned
        self._on = True  # the graph's reads: an error turns them off
        self.calls = 0  # backward() calls while tracing ran (with module calls or without)
        self._trained: set[int] = set()  # models with parameters
        self._pending: list[GraphWalk] | None = None  # the walks of the pass now running
        self._said_ops: dict[Any, Any] = {}  # loss-ops by (model, fqn, op); loss-scaled by model
        self._said: set[tuple[str, str, int]] = set()  # terms and targets said
        self._signals: list[schema.Signal] = []  # the window's, at the pass's end
        self._shares: list[tuple[Share, int]] = []  # and their models
        self.window = Window()
        self.scaling = Scaling(emit)
        self.values = LossValues(emit)
        # (owner, name, PyTorch's, ours): the program's call goes through ours unchanged
        self._patched = [(owner, name, getattr(owner, name), wrap(getattr(owner, name)))
                         for owner, name, wrap in (
                             (torch.autograd, "backward", self._wrap_backward),
                             (torch.Tensor, "backward", self._wrap_tensor_backward),
                             (torch.nn.utils, "clip_grad_norm_", self._wrap_clip))]
        for owner, name, _, ours in self._patched:
            setattr(owner, name, ours)

    def module_seen(self, module: torch.nn.Module, info: ModInfo) -> None:
        if info.has_params:
            self._trained.add(info.model)

    def model_call(self, module: Any, info: Any, step: int) -> None:
        self.window.leave_stale()

    def forward_end(self, end: ForwardEnd) -> None:
        if end.top and not end.in_backward and not self.window.on:
            try:
                self.window.open()
            except Exception:
                self.window.broken = True

    def stop(self, step: int, mode: Mode) -> None:
        if self._on:
            self.values.write()
        self._on = False
        self.window.broken = True
        # another wrapper around ours (a second session) stays; ours then only passes through
        for owner, name, original, ours in self._patched:
            if getattr(owner, name) is ours:
                setattr(owner, name, original)
        with contextlib.suppress(Exception):
            self.window.close()

    # -- backward begins ---------------------------------------------------------------------
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

    def _wrap_tensor_backward(self, original: Callable[..., None]) -> Callable[..., None]:
        # loss.backward() closes the window before torch hands Tensor.backward to it:
        # backward() then runs outside the window's handler, and the stack is the program's
        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if self.window.on:
                try:
                    self.window.close()
                except Exception:
                    self.window.broken = True
            return original(tensor, *args, **kwargs)
        return backward

    def _look(self, tensors: Any) -> None:
        roots: list[Any] = []
        try:
            scale = getattr(self.scaling.find(sys._getframe()), "_scale", None)
            ptr = scale.data_ptr() if isinstance(scale, torch.Tensor) else None
            roots = _roots(tensors)
            self._pending = [lossgraph.walk(root, self._trained, ptr) for root in roots]
        except Exception:  # an odd graph: this pass is not described
            self._pending = None
        # the window closes, walked or not
        self._looked(roots if self._pending is not None else [],
                     {m for w in self._pending or [] for m in w.models})

    def _looked(self, roots: list[Any], models: set[int]) -> None:
        """The window's terms, targets and shares, where the walk reached ``models``."""
        w = self.window
        try:
            w.close()
            if models:
                self._terms(roots, min(models), sorted(models))
                # the shares the window counted (targets left to ``ignore_index``), then those
                # the graph shows (masks, and losses computed where the window was not)
                known = {node for _, node in w.shares if node is not None}
                self._shares.extend((s, min(models)) for s, _ in w.shares)
                self._shares.extend((s, min(models)) for s in reads(roots, known)[:16])
            w.clear()
        except Exception:
            w.broken = True

    def _terms(self, roots: list[Any], model: int, models: list[int]) -> None:
        """The window's terms and regression targets found on the roots' arithmetic top (or
        just below it, for a target), each line said once."""
        w, step = self.window, self._step()
        top = arithmetic_top(roots) if w.terms or w.targets else set()
        for term in w.terms:
            key = (term.cut.reason, term.cut.file, term.cut.line)
            if term.node in top and key not in self._said:
                self._said.add(key)
                self._signals.append(schema.Signal(step, model, "", SignalKind.LOSS_TERM_CUT, {
                    **term.cut._asdict(), "calls": [list(call) for call in term.cut.calls],
                    "added_file": term.file, "added_line": term.line, "models": models}))
        under = top | {child for node in top for child, _ in node.next_functions}
        for node, cut in w.targets:
            key = (cut.reason, cut.file, cut.line)
            found = bootstrapped(node) if node in under and key not in self._said else None
            if found is not None:
                self._said.add(key)
                self._signals.append(schema.Signal(
                    step, found[0], "", SignalKind.LOSS_TARGET_GRAD, {
                        "loss": cut.op, "through": found[1], "file": cut.file,
                        "line": cut.line, "code": cut.code}))

    # -- the pass ends -----------------------------------------------------------------------
    def backward_end(self, end: PassEnd) -> None:
        if end.mode is Mode.RECORDED and end.reached:
            with contextlib.suppress(Exception):
                self.scaling.say_scale(end, self.scaling.find(sys._getframe()))
        self._window_end(end)
        if self._on:
            self.values.ended(end)
        walks, self._pending = self._pending, None
        if end.mode is not Mode.RECORDED:
            self.scaling.scaled.clear()  # past the recorded steps: optimizer steps pay nothing
            return
        if not walks or not self._on:
            return
        try:
            for signal in _ops_said(end.step, walks, self._said_ops):
                self._emit(signal)
            if any(w.scales > 0 for w in walks):
                self.scaling.remember(end)
        except Exception:
            self._on = False  # said nowhere: the other observers go on

    def _window_end(self, end: PassEnd) -> None:
        try:
            self.window.close()
            self.window.clear()
            signals, self._signals = self._signals, []
            shares, self._shares = self._shares, []
            if end.mode is Mode.RECORDED and shares:
                signals.extend(_shares_said(end.step, shares))
            for s in signals:
                self._emit(s)
        except Exception:
            self.window.broken = True

    # -- optimizer steps and clipping ------------------------------------------------------
    def optimizer_stepping(self, step: OptimizerStep) -> None:
        if self.window.on:
            self.window.close()  # the step ends: an optimizer's ops are not the loss's
        self.window.leave_stale()
        if self.scaling.scaled and self._on:
            try:
                self.scaling.stepping(step.optimizer)
            except Exception:
                self._on = False

    def _wrap_clip(self, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(original)
        def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self.scaling.scaled and self._on and not self.scaling.said_clip:
                if not isinstance(parameters, torch.Tensor):
                    parameters = list(parameters)  # what clip_grad_norm_ does first itself
                try:
                    self.scaling.clipping(parameters, args, kwargs)
                except Exception:
                    self._on = False
            return original(parameters, *args, **kwargs)
        return clip_grad_norm_

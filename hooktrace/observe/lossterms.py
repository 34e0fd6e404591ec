"""Every loss term counts: the terms added into a recorded pass's loss that carry no gradient,
a bootstrapped target that carries one, and how much of its batch a classification loss reads.

In a recorded step, from the end of a model call until ``backward()`` (the window where a
training loop builds its loss), a ``TorchFunctionMode`` (``losswindow.py``) follows the
operations: an operation whose output has no gradient though an input needed one cut the graph
there (``.detach()``, ``.data``, an op under ``torch.no_grad()``, an op with no derivative such
as ``argmax``); its output, and what is made from it, carry that cut. A tensor that went to
numpy or a Python number (``.numpy()``, ``.item()``) is remembered as an escape: a number of
the same value, or a tensor made back from numpy, added to the loss came from it. An addition
(``+``, ``-``, ``torch.stack``) of a term with a gradient and one that carries a cut is a
candidate; as ``backward()`` begins, it is a ``loss-term-cut`` signal where its node lies on
the root's arithmetic top (sums, scales, means), i.e. it is a term of the loss, not an
addition inside a model. A regression loss whose target has gradient is looked at from its node
(``losstargets.py``: ``loss-target-grad``). ``F.cross_entropy`` and ``F.nll_loss`` met in the
window count their targets that are not ``ignore_index`` (an op of theirs, read once as the
pass ends): ``loss-share``, where some are ignored. As ``backward()`` begins the loss's graph
adds the masks over its elements and the losses the window did not see (``lossmasks.py``).

A constant that never had a gradient (a loss accumulator started at ``torch.zeros(())``, a
Python number, a regulariser of frozen weights) cuts nothing and is not said. A loss computed
inside a model's own call (the first call of a step) is not in the window: only its share is
read, from its graph.

Cost: nothing outside recorded steps, nor before a step's first model call returns; in the
window one Python call per torch operation (at most ``CAP``, then the window closes), a
dictionary look per input of an op without gradient. An error here closes the window for the
run; the program's operations return what they return.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from hooktrace.hooks.records import Emit, ForwardEnd, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.lossmasks import reads
from hooktrace.observe.losstargets import bootstrapped
from hooktrace.observe.losswindow import Window

_TOP_BUDGET = 64  # nodes of a root's arithmetic top looked at
_TOP = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sum", "Mean", "Stack", "Cat", "View",
                  "Squeeze", "Unsqueeze", "Reshape", "Clone", "ToCopy"})


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


Shares = list[tuple[dict[str, Any], torch.Tensor, torch.Tensor, int, int]]


def _said(step: int, shares: Shares) -> list[schema.Signal]:
    """The ``loss-share`` signals of a pass's shares: their counts read at once, the parts
    read below the whole, multipliers that are 0/1 masks only."""
    device = shares[0][1].device
    counts = torch.stack([torch.stack([s[1].to(device, torch.int64),
                                       s[2].to(device, torch.int64)])
                          for s in shares]).tolist()  # one read
    out = []
    for (detail, _, _, of, model), (read, bad) in zip(shares, counts, strict=True):
        if read < of and not bad:
            out.append(schema.Signal(step, model, "", SignalKind.LOSS_SHARE,
                                     {**detail, "read": int(read), "of": of}))
    return out


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
        self._shares: Shares = []
        # loss.backward() closes it before torch hands Tensor.backward to it: backward() then
        # runs outside the window's handler, and the stack is the program's again at once
        self._tensor_backward = torch.Tensor.backward
        self._wrapped = self._wrap(self._tensor_backward)
        torch.Tensor.backward = self._wrapped  # type: ignore[method-assign]

    def _wrap(self, original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if self._window.on:
                try:
                    self._close()
                except Exception:
                    self._broken = True
            return original(tensor, *args, **kwargs)
        return backward

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
            if torch._C._len_torch_function_stack():
                # a mode of the program's (``with torch.device(...)``) or the op zoom's: the
                # window would sit above it and take its place when the program pops it
                return
            torch._C._push_on_torch_function_stack(w)
            w.on = True
        except Exception:
            self._broken = True

    def _off(self) -> bool:
        """The window off torch's stack, from its top only; False where it stays (a mode pushed
        above it). A ``torch.autograd.backward`` reached inside the window's handler (torch
        has taken it off the stack for the while) leaves it there: it is taken off at the next
        optimizer step or model call (in between, each op passes through it)."""
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
            top = arithmetic_top(roots) if model is not None and (w.terms or w.targets) \
                else set()
            if w.terms:
                self._terms(step, model or 0, models, top)
            if w.targets:
                self._targets(step, top)
            if model is not None:
                self._read(roots, model)
            w.clear()
        except Exception:
            self._broken = True

    def _read(self, roots: list[Any], model: int) -> None:
        """The shares the window counted (targets left to ``ignore_index``), then those the
        loss's graph shows (masks, and losses computed where the window was not)."""
        zero = torch.zeros((), dtype=torch.int64)
        for cut, read, of, ignore, _ in self._window.shares:
            self._shares.append(({"by": "ignore_index", "loss": cut.op, "ignore_index": ignore,
                                  "file": cut.file, "line": cut.line}, read, zero, of, model))
        known = {s[4] for s in self._window.shares if s[4] is not None}
        self._shares.extend((s.detail, s.read, s.bad, s.of, model)
                            for s in reads(roots, known)[:16])

    def _terms(self, step: int, model: int, models: set[int], top: set[Any]) -> None:
        for term in self._window.terms:
            key = (term.cut.reason, term.cut.file, term.cut.line)
            if term.node not in top or key in self._said:
                continue
            self._said.add(key)
            self._signals.append(schema.Signal(step, model, "", SignalKind.LOSS_TERM_CUT, {
                **term.cut._asdict(), "calls": [list(call) for call in term.cut.calls],
                "added_file": term.file, "added_line": term.line,
                "models": sorted(models)}))

    def _targets(self, step: int, top: set[Any]) -> None:
        under = top | {child for node in top for child, _ in node.next_functions}
        for node, cut in self._window.targets:
            key = (cut.reason, cut.file, cut.line)
            found = bootstrapped(node) if node in under and key not in self._said else None
            if found is not None:
                self._said.add(key)
                self._signals.append(schema.Signal(
                    step, found[0], "", SignalKind.LOSS_TARGET_GRAD, {
                    "loss": cut.op, "through": found[1], "file": cut.file, "line": cut.line,
                    "code": cut.code}))

    def backward_end(self, end: PassEnd) -> None:
        try:
            self._close()
            self._window.clear()
            signals, self._signals = self._signals, []
            shares, self._shares = self._shares, []
            if end.mode is Mode.RECORDED and shares:
                signals.extend(_said(end.step, shares))
            for s in signals:
                self._emit(s)
        except Exception:
            self._broken = True

    def optimizer_stepping(self, step: OptimizerStep) -> None:
        self.model_call(None, None, 0)  # an optimizer steps outside the window: not its ops

    def stop(self, step: int, mode: Mode) -> None:
        self._broken = True
        if torch.Tensor.backward is self._wrapped:  # a wrapper around ours stays
            torch.Tensor.backward = self._tensor_backward  # type: ignore[method-assign]
        with contextlib.suppress(Exception):
            self._close()

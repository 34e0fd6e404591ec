"""Custom ``autograd.Function``s of the user's code met in a recorded step: the first call of
each class with an input that requires a gradient gets a numerical gradient check of its
backward against its forward, on detached double copies of the inputs that call saw; a backward
that disagrees is said in a ``function-backward`` signal.

``Function.apply`` is PyTorch's one entry to every custom Function (a ``TorchFunctionMode``
does not see it): in recorded steps it is a thin wrapper that calls PyTorch's own and looks at
the class (from the tracer's start); from the first model call of any other step on it is
PyTorch's own again, so that watched steps pay nothing and ``torch.compile`` (which recorded
steps run eagerly) never traces it, but where the script bound ``MyFunction.apply`` to a name
while it was the wrapper. Functions of torch and installed packages are not
checked (activation checkpointing's, for one, re-runs modules). The check runs with module
tracing paused, on copies: the call's own result and graph are PyTorch's, untouched.

What the check measures, for one random ``grad_output`` v (a private generator's):

* whether the backward scales with ``grad_output`` (``backward(2v) = 2 backward(v)``, as every
  vector-Jacobian product does): one that returns the same for both ignores it;
* at a few elements of each input that requires a gradient, the backward's value against a
  central finite difference of ``<v, forward(x)>``, only where the forward is smooth (its two
  one-sided slopes agree: a kink, such as ReLU's at an exact 0, is skipped).

It records what it measured, never what that means (``check/custom.py`` decides): what
``backward(2v)`` gave (``twice``: ``double``, the ``same``, or ``other``), the elements
compared and how many disagree, the worst one's two values, the ratio of the backward to the
finite difference where one ratio holds at every element, whether the forward returned its
input unchanged (``identity``) and whether it is flat where they disagree (``flat``). Every
forward runs with the global generators seeded alike inside ``fork_rng`` (their state comes
back as it was), under ``no_grad``; the backward on the copies' own small graph.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Function

from hooktrace.hooks.owners import is_library
from hooktrace.hooks.records import Emit, ForwardEnd, ForwardStart, Mode, Observer
from hooktrace.hooks.sites import shown
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind

_APPLY = Function.__dict__["apply"]  # PyTorch's (a classmethod descriptor, in C)
MAX_ELEMENTS = 1 << 20  # inputs larger than this (elements, all together) are not checked
MAX_FORWARD_S = 0.01  # a forward slower than this is not re-run the ~20 times a check needs
PER_INPUT = 4  # elements of each input compared
RTOL = 1e-2  # agreement: relative to the larger of the two values...
ATOL = 1e-6  # ... plus this share of the largest value compared


def backward_site(cls: type) -> tuple[str, int] | None:
    """Where ``cls`` defines ``backward``; None for library code (torch's, a package's)."""
    code = getattr(getattr(cls, "backward", None), "__code__", None)
    if code is None or is_library(code.co_filename):
        return None
    path = inspect.getsourcefile(cls.backward) or code.co_filename  # type: ignore[attr-defined]
    return shown(path), code.co_firstlineno


class FunctionCheck(Observer):
    """Wraps ``Function.apply`` from its making to ``stop``; knows the module call running."""

    follows = (Mode.RECORDED,)

    def __init__(self, emit: Emit, mode: Callable[[], Mode],
                 pause: Callable[[bool], None]) -> None:
        self._emit = emit
        self._mode = mode
        self._pause = pause  # module tracing off (True) while a check runs, then on again
        self._calls: list[ForwardStart] = []  # the traced module calls running
        self._done: set[type] = set()
        self._busy = False
        self._model = 0
        self._step = 0
        self._pid = os.getpid()  # a forked child (a DataLoader worker) checks nothing
        check, done = self._apply, self._done

        def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            out = _APPLY.__get__(None, cls)(*args, **kwargs)
            if cls not in done:
                try:
                    check(cls, args, kwargs)
                except Exception:  # never into the program: this class goes unchecked
                    done.add(cls)
            return out

        self._wrapper = classmethod(apply)
        self._wrapped = False
        # from the tracer's start (a script that binds ``fn = MyFunction.apply`` when it is
        # imported binds the wrapper, which looks at the step's mode) to the first model call
        # of a step that is not recorded
        self._wrap(True)

    def _wrap(self, on: bool) -> None:
        if on != self._wrapped:
            Function.apply = self._wrapper if on else _APPLY
            self._wrapped = on

    def model_call(self, module: torch.nn.Module, info: Any, step: int) -> None:
        self._model = info.model
        self._step = step
        self._calls.clear()
        self._wrap(self._mode() is Mode.RECORDED and os.getpid() == self._pid)

    def forward_start(self, start: ForwardStart) -> None:
        self._calls.append(start)

    def forward_end(self, end: ForwardEnd) -> None:
        calls = self._calls
        while calls and calls.pop() is not end.start:
            pass

    def _apply(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if (self._busy or kwargs or self._mode() is not Mode.RECORDED or os.getpid() != self._pid
                or not torch.is_grad_enabled() or torch.compiler.is_compiling()):
            return
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return
        self._done.add(cls)
        site = backward_site(cls)
        if site is None or torch._C._are_functorch_transforms_active():
            return
        self._busy = True
        self._pause(True)
        try:
            found = check_function(cls, args)
        finally:
            self._pause(False)
            self._busy = False
        if found is not None:
            call = self._calls[-1].info if self._calls else None
            model = call.model if call is not None else self._model
            self._emit(schema.Signal(self._step, model, call.fqn if call else "",
                                     SignalKind.FUNCTION_BACKWARD, {
                                         "function": cls.__qualname__, "file": site[0],
                                         "line": site[1], **found}))

    def stop(self, step: int, mode: Mode) -> None:
        self._wrap(False)


def check_function(cls: Any, args: tuple[Any, ...]) -> dict[str, Any] | None:
    """What the check of ``cls``'s backward at ``args`` (``Function.apply``'s) measured, or
    None when it is not checked (no input needs a gradient, too large or slow, not
    deterministic, not differentiable in double precision) or agrees."""
    wanted = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
              and a.requires_grad and a.is_floating_point()]
    size = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
    if not wanted or size > MAX_ELEMENTS:
        return None
    devices = sorted({a.device.index or 0 for a in args
                      if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
    _DEVICES[:] = devices
    with torch.random.fork_rng(devices=devices):
        try:
            return _check(cls, args, wanted)
        except Exception:  # a Function that will not run in double precision on copies
            return None


def _copies(args: tuple[Any, ...], grad: list[int] | None = None) -> list[Any]:
    """Detached copies: floating tensors in double precision, ``grad`` ones requiring it."""
    out: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            a = a.detach().to(torch.float64) if a.is_floating_point() else a.detach()
            a = a.clone().requires_grad_(grad is not None and i in grad)
        out.append(a)
    return out


def _outputs(out: Any) -> list[torch.Tensor]:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _seed() -> None:
    """The generators ``fork_rng`` keeps, seeded alike before every run: a forward that draws
    draws the same."""
    torch.default_generator.manual_seed(0)
    for device in _DEVICES:
        torch.cuda.default_generators[device].manual_seed(0)


_DEVICES: list[int] = []  # the CUDA devices of the call being checked


def _forward(cls: Any, args: list[Any]) -> list[torch.Tensor]:
    _seed()
    with torch.no_grad():
        return _outputs(cls.apply(*[a.clone() if isinstance(a, torch.Tensor) else a
                                    for a in args]))


def _dot(v: list[torch.Tensor], y: list[torch.Tensor]) -> float:
    return sum(float((a * b).sum()) for a, b in zip(v, y, strict=True))


def _check(cls: Any, args: tuple[Any, ...], wanted: list[int]) -> dict[str, Any] | None:
    base = _copies(args)
    began = time.perf_counter()
    y0 = _forward(cls, base)
    first = time.perf_counter() - began
    if not y0 or first > 10 * MAX_FORWARD_S:
        return None
    y1 = _forward(cls, base)
    if min(first, time.perf_counter() - began - first) > MAX_FORWARD_S:
        return None  # the least of two: a busy machine's one slow run does not decide it
    if not all(torch.equal(a, b) for a, b in zip(y0, y1, strict=True)):
        return None  # not deterministic (even with the generators seeded alike)
    gen = torch.Generator().manual_seed(1234)
    v = [torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device) for y in y0]
    once, twice = _backward(cls, args, wanted, v)
    if once is None or twice is None:
        return None
    scale = max([float(b.abs().max()) for b in once if b.numel()] + [0.0])
    if not all(torch.allclose(b2, 2 * b1, rtol=1e-6, atol=1e-9 * scale)
               for b1, b2 in zip(once, twice, strict=True)):
        same = all(torch.allclose(b2, b1, rtol=1e-6, atol=1e-9 * scale)
                   for b1, b2 in zip(once, twice, strict=True)) and scale > 0
        return {"twice": "same" if same else "other"}
    numeric, backward, identity = _compare(cls, base, wanted, once, v, gen)
    if not numeric:
        return None
    return _measured(numeric, backward, identity)


def _backward(cls: Any, args: tuple[Any, ...], wanted: list[int], v: list[torch.Tensor]
              ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """The backward's gradients of the ``wanted`` inputs for ``v`` and for ``2 v`` (zeros for
    an input it gives None), on the copies' own graph."""
    xs = _copies(args, wanted)
    _seed()
    with torch.enable_grad():
        outs = [o for o in _outputs(cls.apply(*xs)) if o.requires_grad]
        if len(outs) != len(v):
            return None, None
        inputs = [xs[i] for i in wanted]
        got = []
        for factor in (1.0, 2.0):
            grads = torch.autograd.grad(outs, inputs, [factor * g for g in v],
                                        retain_graph=factor == 1.0, allow_unused=True)
            got.append([torch.zeros_like(x) if g is None else g.detach()
                        for x, g in zip(inputs, grads, strict=True)])
    return got[0], got[1]


def _compare(cls: Any, base: list[Any], wanted: list[int], once: list[torch.Tensor],
             v: list[torch.Tensor], gen: torch.Generator
             ) -> tuple[list[float], list[float], bool]:
    """At a few elements of each wanted input where the forward is smooth: the central finite
    difference of ``<v, forward>`` and the backward's value; and whether the forward returned
    its (first wanted) input unchanged at every point it ran at (the identity, not only at
    this input: a ReLU on inputs all positive is not one)."""
    y0 = _forward(cls, base)
    s0 = _dot(v, y0)
    identity = _returns(base[wanted[0]], y0)
    numeric: list[float] = []
    backward: list[float] = []
    for k, i in enumerate(wanted):
        x = base[i]
        if x.numel() == 0:
            continue
        for j in torch.randperm(x.numel(), generator=gen)[:PER_INPUT].tolist():
            value = float(x.reshape(-1)[j])
            h = 1e-6 * max(1.0, abs(value))
            slopes = []
            for step in (h, -h):
                moved = list(base)
                moved[i] = x.clone()
                moved[i].reshape(-1)[j] += step
                y = _forward(cls, moved)
                identity = identity and _returns(moved[i], y)
                slopes.append((_dot(v, y) - s0) / step)
            up, down = slopes
            if abs(up - down) > RTOL * max(abs(up), abs(down)) + 1e-7:
                continue  # a kink at this element: its two slopes differ
            numeric.append((up + down) / 2)
            backward.append(float(once[k].reshape(-1)[j]))
    return numeric, backward, identity


def _returns(x: torch.Tensor, y0: list[torch.Tensor]) -> bool:
    """Whether one of the forward's outputs is ``x`` unchanged."""
    return any(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for y in y0)


def _measured(numeric: list[float], backward: list[float], identity: bool
              ) -> dict[str, Any] | None:
    """Where the backward's values and the finite differences disagree: how many, the worst,
    their ratio where one holds at every element, and whether the forward is flat there."""
    largest = max(map(abs, numeric + backward))
    atol = ATOL * largest + 1e-12
    off = [i for i, (n, b) in enumerate(zip(numeric, backward, strict=True))
           if abs(n - b) > RTOL * max(abs(n), abs(b)) + atol]
    if not off:
        return None
    dot = sum(n * b for n, b in zip(numeric, backward, strict=True))
    norm = sum(n * n for n in numeric)
    ratio = dot / norm if norm > atol * atol else 0.0
    worst = max(off, key=lambda i: abs(numeric[i] - backward[i]))
    found: dict[str, Any] = {
        "twice": "double", "elements": len(numeric), "off": len(off),
        "numeric": numeric[worst], "backward": backward[worst], "identity": identity,
        "flat": all(abs(numeric[i]) <= atol for i in off)}
    if norm > atol * atol and all(abs(b - ratio * n) <= RTOL * abs(ratio * n) + atol
                                  for n, b in zip(numeric, backward, strict=True)):
        found["ratio"] = ratio
    return found

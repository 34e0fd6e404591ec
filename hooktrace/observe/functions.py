"""Custom ``autograd.Function``s of the user's code met in a recorded step: the first call of
each class with an input that requires a gradient gets a numerical gradient check
(``fncheck``); a backward that disagrees is said in a ``function-backward`` signal.

``Function.apply`` is PyTorch's one entry to every custom Function (a ``TorchFunctionMode``
does not see it): in recorded steps it is a thin wrapper that calls PyTorch's own and looks at
the class (from the tracer's start); from the first model call of any other step on it is
PyTorch's own again, so that watched steps pay nothing and ``torch.compile`` (which recorded
steps run eagerly) never traces it, but where the script bound ``MyFunction.apply`` to a name
while it was the wrapper. Functions of torch and installed packages are not
checked (activation checkpointing's, for one, re-runs modules). The check runs with module
tracing paused, on copies: the call's own result and graph are PyTorch's, untouched.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Function

from hooktrace.hooks.owners import is_library
from hooktrace.hooks.records import Emit, ForwardEnd, ForwardStart, Mode, Observer
from hooktrace.hooks.sites import shown
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe import fncheck

_APPLY = Function.__dict__["apply"]  # PyTorch's (a classmethod descriptor, in C)


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
            found = fncheck.check_function(cls, args)
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

"""Recorded steps run compiled code eagerly: ``torch.compiler.set_stance("force_eager")`` while
a step is recorded, the program's own stance in the steps after them.

Under ``force_eager`` a ``torch.compile``'d model (``torch.compile(model)``, ``model.compile()``)
or function runs its Python code and every global module hook fires; outside it compiled code
runs no module hook (docs/architecture.md, Measured facts). The stance is read at each call of
compiled code, so switching it at a step's end makes the next step eager or compiled; code
compiled once is reused when the steps after the recorded ones run compiled again (the compile
happens there, not in step 0). A watched step that ran compiled and found a NaN/Inf makes the
next step eager too (``look``), so that its module hooks name the module.

``torch._dynamo`` takes 1.5 s to import: the stance is set when the program imports it
(``torch.compile`` and every optimizer step do), never by hooktrace first. Also counted for the
end record: the graphs ``torch.compile`` compiled while tracing ran (``End.compiled``). A stance
that cannot be set is said in one line; the program goes on, its compiled code unseen.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any

from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Emit, Mode, Observer, PassEnd
from hooktrace.log import schema
from hooktrace.log.options import Steps
from hooktrace.log.schema import SignalKind

_EVAL_FRAME = "torch._dynamo.eval_frame"
_FRAMES = 64  # frames looked up from a model call for torch.compile's wrapper


def _dynamo_graphs() -> int:
    """Graphs torch.compile has compiled in this process (0 before torch._dynamo is loaded):
    ``fullgraph=True`` counts no frame, and a frame of hooktrace's own hooks compiles to no
    graph (docs/tracing.md, Compiled models)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return int(counters["stats"]["unique_graphs"]) if counters is not None else 0


def _then(run: Callable[[ModuleType], None], then: Callable[[], None]
          ) -> Callable[[ModuleType], None]:
    def exec_module(module: ModuleType) -> None:
        run(module)
        then()
    return exec_module


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once ``torch._dynamo.eval_frame`` has been imported (by the program)."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != _EVAL_FRAME:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                loader: Any = spec.loader  # its own loader: the module runs, then ``then``
                loader.exec_module = _then(loader.exec_module, self._then)
                return spec
        return None


class EagerSteps(Observer):
    """Holds the ``force_eager`` stance while a step is recorded; emits ``compiled-eager`` the
    first time a model call of a recorded step runs inside compiled code."""

    follows = ()  # no module call: model calls and passes only

    def __init__(self, steps: Steps, emit: Emit) -> None:
        self._steps = steps
        self._emit = emit
        self._recorded = 0 in steps
        self._prior: Any = None  # the program's stance while ours is in force
        self._said = False
        self._failed = False
        self._look = False  # the next step runs eagerly though not recorded (watch.py)
        self._graphs = _dynamo_graphs()
        self._finder: _OnImport | None = None
        if _EVAL_FRAME in sys.modules:
            self._apply()
        else:
            self._finder = _OnImport(self._apply)
            sys.meta_path.insert(0, self._finder)

    @property
    def compiled(self) -> int:
        """Graphs torch.compile compiled since tracing began."""
        return _dynamo_graphs() - self._graphs

    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        if self._said or self._prior is None:
            return
        frame: FrameType | None = sys._getframe(1)
        wrapper = sys.modules[_EVAL_FRAME].__file__
        for _ in range(_FRAMES):
            if frame is None:
                return
            if frame.f_code.co_filename == wrapper:
                self._said = True
                self._emit(schema.Signal(step, info.model, info.fqn, SignalKind.COMPILED_EAGER))
                return
            frame = frame.f_back

    def look(self) -> None:
        """Run the next step eagerly: a watched step that ran compiled found a NaN/Inf, and
        the module hooks of an eager step name the module."""
        self._look = True

    def backward_end(self, end: PassEnd) -> None:
        self._recorded = end.step + 1 in self._steps or self._look
        self._look = False
        self._apply()

    def stop(self, step: int, mode: Mode) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._recorded = False
        self._apply()

    def _apply(self) -> None:
        """Force eager in a recorded step, the program's stance otherwise (put back also after
        a refusal: tracing never leaves its stance behind)."""
        dynamo = sys.modules.get(_EVAL_FRAME)
        if dynamo is None:
            return
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        try:
            if self._recorded and self._prior is None and not self._failed:
                self._prior = dynamo._set_stance(dynamo.DynamoStance("force_eager"))
            elif not self._recorded and self._prior is not None:
                dynamo._set_stance(self._prior)
                self._prior = None
        except Exception as e:  # inside a compiled region: torch refuses a change of stance
            if not self._failed:
                self._failed = True
                print(f"hooktrace: the stance of torch.compile'd code could not be changed at "
                      f"a step's end ({e}); compiled code may run unseen in recorded steps",
                      file=sys.stderr)

"""Assembles a tracing session: the hook core and its observers, in the order they must run.

``core.py`` follows the module calls; the observers (``records.Observer``) do the rest, in the
order of ``Tracer.start``'s list, where each constraint on that order is said at its line (the
records they emit at a step's end are written in that order too, so it is part of the log).
Statistics (``stats.TensorStats``) are shared by the observers that read numbers. Observers hand
records to the log writer's ``emit`` (naming's model and module records to its ``emit_now``);
the log writer tells the ops observer what it meets (``recorder.Facts``), which asks the zoom
for modules (``opzoom.ZoomRequests``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from hooktrace.hooks.core import CallTracker
from hooktrace.hooks.naming import Naming
from hooktrace.hooks.records import Observer
from hooktrace.hooks.sites import error_site
from hooktrace.log.errors import plain
from hooktrace.log.options import TraceOptions
from hooktrace.observe.breakon import BreakOnNonfinite
from hooktrace.observe.capture import Capture, CaptureObserver
from hooktrace.observe.diagnose import Diagnosis
from hooktrace.observe.eager import EagerSteps
from hooktrace.observe.functions import FunctionCheck
from hooktrace.observe.gradzeros import GradZeros
from hooktrace.observe.hookcount import HookCount
from hooktrace.observe.ledger import ParamLedger
from hooktrace.observe.loss import LossObserver
from hooktrace.observe.ops import OpsObserver
from hooktrace.observe.optimizers import Optimizers
from hooktrace.observe.outputs import OutputCheck
from hooktrace.observe.paramnorms import ParamNorms
from hooktrace.observe.probe import Probe
from hooktrace.observe.recorder import LogRecorder, Sink
from hooktrace.observe.stats import TensorStats
from hooktrace.observe.stepcheck import StepSample
from hooktrace.observe.timing import CallTimes
from hooktrace.observe.twins import Twins
from hooktrace.observe.watch import Watch

__all__ = ["Sink", "Tracer"]


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
        self._capture = capture
        self._stats = TensorStats(self._options.break_on_nan) if self._options.stats else None
        self._core = CallTracker(self._options)
        self._naming: Naming | None = None
        self._eager: EagerSteps | None = None
        self._loss: LossObserver | None = None

    @property
    def backward_calls(self) -> int:
        """``backward()`` calls while tracing ran, seen with module calls or without."""
        return self._loss.calls if self._loss else 0

    @property
    def models(self) -> int:
        """The models named so far."""
        return self._naming.models if self._naming else 0

    @property
    def compiled(self) -> int:
        """Graphs ``torch.compile`` compiled while tracing ran."""
        return self._eager.compiled if self._eager else 0

    @property
    def steps(self) -> int:
        """Backward passes completed while tracing."""
        return self._core.step

    @property
    def events(self) -> int:
        return self._core.events

    @property
    def dropped(self) -> int:
        return self._core.dropped

    @property
    def error(self) -> str | None:
        return self._core.error

    @error.setter
    def error(self, value: str | None) -> None:
        self._core.error = value

    def start(self) -> Tracer:
        stats = self._stats
        outputs = OutputCheck(stats) if stats is not None else None
        recorder = LogRecorder(self._sink, stats, outputs)
        naming = self._naming = Naming(recorder.emit_now, self._options.matches, self._models)
        observers: list[Observer] = []
        if self._capture is not None:
            observers.append(CaptureObserver(self._capture, naming.model_name))
        observers.append(ParamNorms(stats, naming.uncalled, recorder.emit))
        eager = self._eager = EagerSteps(self._options.steps, recorder.emit)
        if stats is not None and self._options.watch:
            observers.append(Watch(stats, recorder.emit, eager.look))
        optimizers = Optimizers(recorder.emit, naming.uncalled)
        observers.append(Diagnosis(recorder.emit, optimizers))  # tells it of freezes: before
        observers.append(optimizers)
        observers.append(HookCount(recorder.emit))
        paused: list[bool] = []

        def pause(on: bool) -> None:  # module calls a Function check makes are not the script's
            if on:
                paused.append(self._core.active)
                self._core.active = False
            else:
                self._core.active = paused.pop()

        observers.append(FunctionCheck(recorder.emit, lambda: self._core.mode, pause))
        if self._options.probe:
            observers.append(Probe(recorder.emit, pause))
        core = self._core

        def backward_began() -> Callable[[], None]:
            step = core.step  # a pass compiled code ran, no module hook saw: ended at return
            return lambda: core.backward_returned(step) if eager.compiled else None

        self._loss = LossObserver(recorder.emit, lambda: core.mode, lambda: core.step,
                                  backward_began)
        observers.append(self._loss)
        observers.append(eager)
        observers.append(ParamLedger(recorder.emit, optimizers.modules))
        observers.append(Twins(recorder.emit, naming.known, naming.model_name))
        observers.append(StepSample(recorder.emit, optimizers))
        if stats is not None:
            observers.append(GradZeros(stats, recorder.emit))
        ops = recorder.facts = OpsObserver(core.zoom, recorder.emit, self._options)
        core.zoom.connect(ops.take, stats.nonfinite if stats else None,
                          stats.grad if stats else None)
        observers.append(ops)
        if self._options.time:  # before the writer: its work at a call's end is not the call's
            observers.append(CallTimes(recorder.emit))
        observers.append(recorder)  # after those that emit: their records precede the step's
        if stats is not None and self._options.break_on_nan:
            observers.append(BreakOnNonfinite(stats))  # the NaN's own event is written first
        self._core.start(naming, observers)
        return self

    def stop(self) -> None:
        """Remove every hook and write what is buffered. Safe to call twice."""
        self._core.stop()

    def describe(self, error: BaseException) -> dict[str, Any]:
        """The end record's ``error``: its type and message, the module whose call raised it
        (when tracing had named it) and the line of the user's code it came through."""
        described: dict[str, Any] = {"type": type(error).__name__, "message": plain(str(error))}
        if isinstance(error, KeyboardInterrupt) or (
                isinstance(error, SystemExit) and error.code in (0, None)):
            return described  # the script chose to stop: no place to point at
        try:
            module, path, line, code = error_site(error)
            info = self._naming.known(module) if module is not None and self._naming else None
            if info is not None:
                described.update(model=info.model, module=info.fqn)
            if path is not None:
                described.update(file=path, line=line)
                if isinstance(error, SystemExit) and code:  # where it exited: check and run say
                    described["code"] = code
        except Exception:  # a frame that cannot be read: the type and message still say it
            pass
        return described

    def _fail(self, error: BaseException) -> None:
        self._core.fail(error)

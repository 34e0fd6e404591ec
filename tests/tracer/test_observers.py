"""The core's observer interface: what an observer is handed, in what order, and where what it
emits lands in the log. Exact ordered lists, on a small inline model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hooktrace.hooks.core import CallTracker
from hooktrace.hooks.naming import ModInfo, Naming
from hooktrace.hooks.records import (
    BackwardStart,
    ForwardEnd,
    Mode,
    Observer,
    OptimizerStep,
    PassEnd,
    step_mode,
)
from hooktrace.log import schema
from hooktrace.log.options import Steps, TraceOptions
from hooktrace.observe.recorder import LogRecorder


class ListSink:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def write(self, record: Any) -> None:
        self.records.append(record)

    def flush(self) -> None:
        pass


class Seen(Observer):
    """Records what it is handed; emits one anomaly per step (as a diagnosis observer would)."""

    def __init__(self, emit: Any) -> None:
        self.emit = emit
        self.seen: list[tuple[Any, ...]] = []

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        self.seen.append(("module", info.fqn, type(module).__name__))

    def model_call(self, module: nn.Module, info: ModInfo, step: int) -> None:
        self.seen.append(("model", info.fqn, module.training, step))

    def forward_end(self, end: ForwardEnd) -> None:
        self.seen.append(("forward", end.call.info.fqn, end.call.step, end.mode.name))

    def backward_start(self, start: BackwardStart) -> None:
        self.seen.append(("backward", start.call.info.fqn, start.step, start.mode.name))

    def backward_end(self, end: PassEnd) -> None:
        self.seen.append(("end", end.step, end.mode.name))
        self.emit(schema.Anomaly(end.step, 0, "", "no-grad"))


def _run(options: TraceOptions, steps: int) -> tuple[Seen, ListSink]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    sink = ListSink()
    core = CallTracker(options)
    recorder = LogRecorder(sink, None, None)
    seen = Seen(recorder.emit)
    core.start(Naming(sink.write, options.matches, [model]), [seen, recorder])
    try:
        for step in range(steps):
            model.train(step == 0)
            model(torch.randn(2, 3)).sum().backward()
    finally:
        core.stop()
    return seen, sink


def test_observer_is_handed_modules_model_calls_calls_and_step_ends() -> None:
    seen, _ = _run(TraceOptions(steps=Steps.parse("0")), 2)
    assert seen.seen == [
        ("module", "", "Sequential"), ("model", "", True, 0),
        ("module", "0", "Linear"), ("forward", "0", 0, "RECORDED"),
        ("module", "1", "ReLU"), ("forward", "1", 0, "RECORDED"),
        ("forward", "", 0, "RECORDED"),
        ("backward", "", 0, "RECORDED"), ("backward", "1", 0, "RECORDED"),
        ("backward", "0", 0, "RECORDED"),
        ("end", 0, "RECORDED"),
        ("model", "", False, 1),  # each module is seen once; every top-level call is handed on
        ("forward", "0", 1, "WATCHED"), ("forward", "1", 1, "WATCHED"),
        ("forward", "", 1, "WATCHED"),
        ("backward", "", 1, "WATCHED"),  # a watched step follows model calls' backward only
        ("end", 1, "WATCHED"),
    ]


def test_emitted_records_land_after_the_steps_events_and_before_its_step_record() -> None:
    _, sink = _run(TraceOptions(steps=Steps.parse("0")), 2)
    kinds = [type(r).__name__ for r in sink.records
             if not isinstance(r, (schema.Model, schema.Module))]
    assert kinds == ["ForwardEvent"] * 3 + ["BackwardEvent"] * 3 + ["Anomaly", "Step", "Anomaly"]
    assert [r.step for r in sink.records if isinstance(r, schema.Anomaly)] == [0, 1]


def test_step_mode_is_recorded_then_watched_or_off() -> None:
    options = TraceOptions(steps=Steps.parse("0:2"))
    assert [step_mode(s, options, False) for s in range(3)] == [
        Mode.RECORDED, Mode.RECORDED, Mode.WATCHED]
    assert step_mode(0, options, True) is Mode.WATCHED  # --max-events reached
    no_watch = TraceOptions(steps=Steps.parse("0:2"), watch=False)
    assert step_mode(2, no_watch, False) is Mode.OFF
    assert step_mode(2, TraceOptions(steps=Steps.parse("0:2"), stats=False), False) is Mode.OFF


class Stepping(Observer):
    """Sees each optimizer step begin and end; the first one it is handed may raise."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.seen: list[tuple[str, str, int]] = []

    def optimizer_stepping(self, step: OptimizerStep) -> None:
        self.seen.append(("stepping", type(step.optimizer).__name__, len(step.args)))
        if self.raises:
            raise RuntimeError("an observer's bug")

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        self.seen.append(("stepped", type(step.optimizer).__name__, len(step.args)))


def test_the_optimizer_step_is_one_moment_handed_to_each_observer_in_order() -> None:
    """One registration (the core's); an observer that raises is handed no more of that moment,
    the program's step runs as it would, the others go on; nothing is left registered."""
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    before = (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks))
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    core = CallTracker(TraceOptions())
    broken, steps = Stepping(raises=True), Stepping()
    core.start(Naming(ListSink().write, TraceOptions().matches, [model]), [broken, steps])
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == (
        before[0] + 1, before[1] + 1)
    try:
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            weight = model.weight.detach().clone()
            opt.step()
            assert not torch.equal(weight, model.weight)
    finally:
        core.stop()
    assert broken.seen == [("stepping", "SGD", 1), ("stepped", "SGD", 1), ("stepped", "SGD", 1)]
    assert steps.seen == [("stepping", "SGD", 1), ("stepped", "SGD", 1)] * 2
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == before


def test_a_long_run_is_sampled_evenly_with_its_last_value() -> None:
    """The loss ledger's values and the optimizers' learning rates keep a bounded sample: the
    first, an even spread, and the last value, whichever of them the sampling took."""
    from itertools import pairwise

    from hooktrace.observe.lossvalues import Thinned
    for n in (1, 256, 257, 1000, 1025):
        sample = Thinned()
        for i in range(n):
            sample.add(i, float(i))
        keys, values = sample.pairs()
        assert keys[0] == 0 and keys[-1] == n - 1 and values == [float(k) for k in keys]
        assert len(keys) <= 258 and keys == sorted(set(keys))
        spaced = keys[:-1] if (n - 1) % sample.every else keys
        assert {b - a for a, b in pairwise(spaced)} <= {sample.every}

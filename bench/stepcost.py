"""What issue 36's item 1 costs: the step's sample (``observe/stepcheck.py``) at a recorded
step's end and in the optimizer step hooks that follow (called directly: the step itself is
not timed), on W1 and W2 (CPU), under SGD with momentum and AdamW (with their state); and the
same in a step that is not recorded (no gradient sample read); and the share of it the move
(``observe/stepmove.py``: weights, gradient and state sampled before the step, weights after,
the update modelled) takes.

    python -m bench.stepcost

Each number is the least of several timings (the machine is shared): what the work costs, not
what a busy machine adds to it. The untraced step times are given for scale.
"""

from __future__ import annotations

import weakref

import torch

from bench import workloads
from bench.measure import least
from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Mode, OptimizerStep, PassEnd
from hooktrace.observe.optimizers import Optimizers
from hooktrace.observe.stepcheck import StepSample
from hooktrace.observe.stepmove import Moves


class _NoMoves(Moves):
    def before(self, *_: object) -> None:
        pass

    def after(self, *_: object) -> None:
        pass


def costs(observer: StepSample, optimizer: torch.optim.Optimizer) -> dict[Mode, float]:
    """What tracing adds to a step, recorded and not: the pass's end, the two optimizer hooks
    (called directly: the step itself is not timed)."""
    out = {}
    for mode in (Mode.RECORDED, Mode.WATCHED):
        end = PassEnd(0, mode, (), ())

        def step(end: PassEnd = end) -> None:
            observer.backward_end(end)
            observer.optimizer_stepping(OptimizerStep(optimizer, (optimizer,), {}))
            observer.optimizer_stepped(OptimizerStep(optimizer, (optimizer,), {}))
        out[mode] = least(step, 50)
    return out


def observed(work: workloads.Workload, optimizer: torch.optim.Optimizer,
             moves: bool) -> dict[Mode, float]:
    optimizers = Optimizers(lambda _: None)
    observer = StepSample(lambda _: None, optimizers)
    if not moves:
        observer._moves = _NoMoves(observer._names)
    try:
        for fqn, module in work.model.named_modules():
            params = bool(module._parameters)
            optimizers.module_seen(module, ModInfo(0, fqn, type(module).__name__, True,
                                                 weakref.ref(module), params))
        return costs(observer, optimizer)
    finally:
        observer.stop(0, Mode.OFF)


def main() -> None:
    device = torch.device("cpu")
    for name in ("W1", "W2"):
        work = workloads.build(name, device)
        untraced = least(work.step, 10)
        for optimizer in (torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9),
                          torch.optim.AdamW(work.model.parameters(), lr=1e-4)):
            work.step()  # every parameter has its .grad
            optimizer.step()  # and the optimizer its state
            cost = observed(work, optimizer, moves=True)
            without = observed(work, optimizer, moves=False)
            kind = type(optimizer).__name__
            print(f"{name} {kind}: the step explained {cost[Mode.RECORDED] * 1e6:.0f} us a "
                  f"recorded step (the move "
                  f"{(cost[Mode.RECORDED] - without[Mode.RECORDED]) * 1e6:.0f} us of it), "
                  f"{cost[Mode.WATCHED] * 1e6:.0f} us another "
                  f"({len(list(work.model.parameters()))} parameters); an untraced step "
                  f"{untraced * 1e3:.1f} ms ({cost[Mode.RECORDED] / untraced:.2%})")


if __name__ == "__main__":
    main()

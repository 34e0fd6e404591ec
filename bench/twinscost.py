"""What issue 36's item 5 costs a recorded step: the twins observer (``observe/twins.py``) at
the pass's end and after the optimizer's step, on W1 and W2 alone (no twin: the common case)
and beside an EMA copy of themselves (two fingerprints at the pass's end, one after the step).

    python -m bench.twinscost

Each number is the least of several timings (the machine is shared): what the work costs, not
what a busy machine adds to it. The step times are an untraced step's, for scale.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from bench import workloads
from bench.measure import least
from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.records import Mode, PassEnd
from hooktrace.observe.twins import Twins


def observer(models: dict[str, nn.Module]) -> Twins:
    """The observer as tracing builds it, having seen ``models`` called (as model 0, 1, ...)."""
    names = list(models)
    infos = {m: ModInfo(i, "", type(m).__name__, True, lambda m=m: m, False)
             for i, m in enumerate(models.values())}
    twins = Twins(lambda _: None, infos.get, names.__getitem__)
    for module, info in infos.items():
        twins.module_seen(module, info)
    return twins


def recorded_step(twins: Twins, optimizer: torch.optim.Optimizer) -> None:
    """What one recorded step asks of it: the pass's end, then the optimizer's step hook (from
    a frame whose variables hold the models, as a training loop's do)."""
    twins.backward_end(PassEnd(0, Mode.RECORDED, (), ()))
    twins._optimizer_stepped(optimizer)


def alone(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    twins = observer({"model": model})
    try:
        return least(lambda: recorded_step(twins, optimizer), 50)
    finally:
        twins.stop(0, Mode.OFF)


def beside_ema(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    ema = copy.deepcopy(model).requires_grad_(False)
    twins = observer({"model": model, "ema": ema})
    try:
        return least(lambda: recorded_step(twins, optimizer), 20)
    finally:
        twins.stop(0, Mode.OFF)


def main() -> None:
    device = torch.device("cpu")
    for name in ("W1", "W2"):
        work = workloads.build(name, device)
        optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4)
        step = least(work.step, 10)
        one = alone(work.model, optimizer)
        two = beside_ema(work.model, optimizer)
        params = sum(p.numel() for p in work.model.parameters())
        print(f"{name} ({params / 1e6:.2f}M parameters): an untraced step {step * 1e3:.1f} ms; "
              f"twins a recorded step: alone {one * 1e6:.1f} us ({one / step:.3%}), beside "
              f"an EMA copy {two * 1e3:.2f} ms ({two / step:.1%})")

if __name__ == "__main__":
    main()

"""What issue 36's item 3 costs: the hook count at a recorded step's end (W1, W2), the
``Function.apply`` wrapper per call, and one numerical check of a custom Function.

    python -m bench.customcost

Each number is the least of several timings (the machine is shared): what the work costs, not
what a busy machine adds to it. The step times are an untraced step's, for scale.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import Function
from torch.nn import functional as F

from bench import workloads
from bench.measure import least
from hooktrace.hooks.records import Mode
from hooktrace.observe.functions import _APPLY, FunctionCheck, check_function
from hooktrace.observe.hookcount import hook_counts


class Gelu(Function):
    """A tanh-approximated GELU with its right backward: a Function as users write them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return F.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (g,) = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, grad)
        return g


def main() -> None:
    device = torch.device("cpu")
    for name in ("W1", "W2"):
        work = workloads.build(name, device)
        modules = list(work.model.modules())
        look = least(lambda modules=modules: [hook_counts(m) for m in modules], 50)  # type: ignore[misc]
        step = least(work.step, 10)
        print(f"{name}: hook count {look * 1e6:.0f} us a recorded step for {len(modules)} "
              f"modules; an untraced step {step * 1e3:.1f} ms ({look / step:.2%})")
    x = torch.randn(8, 16, requires_grad=True)
    plain = least(lambda: _APPLY.__get__(None, Gelu)(x), 20, 200)
    # the wrapper as tracing installs it, in a step that is not recorded (a recorded one checks
    # each class once, then takes the same path)
    wrapper = FunctionCheck(lambda _: None, lambda: Mode.OFF, lambda _: None)
    try:
        through = least(lambda: Gelu.apply(x), 20, 200)
    finally:
        wrapper.stop(0, Mode.OFF)
    print(f"Function.apply: {plain * 1e6:.1f} us a call, {through * 1e6:.1f} us wrapped "
          f"(+{(through - plain) * 1e6:.1f} us)")
    for shape in ((8, 16), (64, 1024), (256, 4096)):
        x = torch.randn(*shape, requires_grad=True)
        checked = least(lambda x=x: check_function(Gelu, (x,)), 5)  # type: ignore[misc]
        print(f"one check of a GELU Function on {tuple(shape)}: {checked * 1e3:.1f} ms "
              f"(once per class and run)")


if __name__ == "__main__":
    main()

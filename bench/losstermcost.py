"""What issue 36's item 2 costs a recorded step on W1 (``mse_loss``) and W2 (``cross_entropy``):
the loss observer's window, by its parts, measured on the workload's own model output and loss.

    python -m bench.losstermcost

* ``forward_end`` is called for each module call of a recorded step (it opens the window at a
  model call's end only);
* the window: the loss computed with the window open (each op through the mode; for
  ``cross_entropy`` one more op counting the targets not ignored), ``looked`` as backward
  begins, and ``backward_end`` (the one read of the counts), less the loss computed plainly;
* a padded batch's per-token loss under a 0/1 mask: the same, with the mask's count.

A whole traced step is too noisy on a shared machine to show a few microseconds, so each part
is timed alone: each number is the least of several timings (what the work costs, not what a
busy machine adds to it). The step times are an untraced step's, for scale.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.nn import functional as F

from bench import workloads
from bench.measure import least
from hooktrace.hooks.records import Mode, PassEnd
from hooktrace.observe.loss import LossObserver


def interleaved(plain: Any, other: Any, rounds: int = 10) -> tuple[float, float]:
    """The least time of each, their rounds alternating, so that both meet the same moments
    of a busy machine (one after the other, the second met another load: a negative cost)."""
    least_plain = least_window = float("inf")
    for _ in range(rounds):
        least_plain = min(least_plain, least(plain, 3, 20))
        least_window = min(least_window, least(other, 3, 20))
    return least_plain, least_window


def observer(said: list[Any]) -> LossObserver:
    return LossObserver(said.append, lambda: Mode.RECORDED, lambda: 0)


def windowed(terms: LossObserver, loss: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """The loss computed plainly, and with the window open, read as backward begins and
    ``backward_end``; then tracing stops for ``terms``."""
    end = PassEnd(0, Mode.RECORDED, (), ())

    def with_window() -> None:
        terms.window.open()
        root = loss()
        terms._looked([root.grad_fn], {0})
        terms.backward_end(end)

    try:
        return interleaved(loss, with_window)
    finally:
        terms.stop(0, Mode.RECORDED)


def measure(name: str) -> str:
    work = workloads.build(name, torch.device("cpu"))
    modules = len(list(work.model.modules()))
    batch = torch.randn(32, 64) if name == "W1" else torch.randn(8, 3, 64, 64)
    out = work.model(batch)
    target = torch.randn_like(out) if name == "W1" else torch.randint(0, 1000, (8,))

    def loss() -> torch.Tensor:
        return F.mse_loss(out, target) if name == "W1" else F.cross_entropy(out, target)

    said: list[Any] = []
    terms = observer(said)
    inner: Any = SimpleNamespace(top=False, in_backward=False)

    def ends() -> None:
        for _ in range(modules):
            terms.forward_end(inner)

    calls = least(ends, 30)
    plain, window = windowed(terms, loss)
    step = least(work.step, 5, 1)
    added = calls + window - plain
    return (f"{name}: forward_end {calls * 1e6:.1f} us for {modules} module calls; the window "
            f"{(window - plain) * 1e6:.1f} us (the loss alone {plain * 1e6:.1f} us); in all "
            f"{added * 1e6:.0f} us a recorded step, an untraced step {step * 1e3:.1f} ms "
            f"({added / step:.2%}); signals {len(said)}")


def measure_mask() -> str:
    """A padded batch's per-token loss under a 0/1 mask (8 sequences of 128 tokens, 1000
    classes), the logits standing for a model's output: the window and the graph's read."""
    logits = torch.randn(8 * 128, 1000, requires_grad=True)
    target = torch.randint(1, 1000, (8 * 128,))
    mask = (torch.arange(128) < torch.randint(32, 129, (8, 1))).float().flatten()
    said: list[Any] = []
    terms = observer(said)

    def loss() -> torch.Tensor:
        return (F.cross_entropy(logits, target, reduction="none") * mask).sum() / mask.sum()

    plain, window = windowed(terms, loss)
    return (f"masked per-token loss: the window and the mask's count "
            f"{(window - plain) * 1e6:.1f} us a recorded step (the loss alone "
            f"{plain * 1e6:.1f} us); signals {len(said)}")


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # two threads on a shared machine: each timing meets the other load
    for name in ("W1", "W2"):
        print(measure(name))
    print(measure_mask())


if __name__ == "__main__":
    main()

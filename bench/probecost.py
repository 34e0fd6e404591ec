"""What ``--probe`` (issue 36, item 4) costs: one probe of each workload's model (a deep copy,
one forward, a few vector-Jacobian products), next to an untraced training step.

    python -m bench.probecost [--workloads W1,W2,W3]

The probe runs once per model in a run, at its first call in a recorded step. Each number is
the least of a few timings (the machine is shared): what the work costs, not what a busy
machine adds to it.
"""

from __future__ import annotations

import argparse

import torch

from bench import workloads
from bench.measure import least
from hooktrace.observe.seeing import probe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="W1,W2,W3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for name in args.workloads.split(","):
        work = workloads.build(name, device)
        batch = _batch(work)

        def step(work: workloads.Workload = work) -> None:
            work.step()
            sync()

        def probed(work: workloads.Workload = work, batch: torch.Tensor = batch) -> None:
            probe(work.model, (batch,), {})
            sync()

        step()
        facts = probe(work.model, (batch,), {})
        taken, plain = least(probed, args.repeat), least(step, args.repeat)
        print(f"{name} ({work.description}, {device.type}): one probe {taken * 1e3:.1f} ms, "
              f"an untraced step {plain * 1e3:.1f} ms ({taken / plain:.1f} steps); found "
              f"{[(f['what'], f.get('verdict')) for f in facts]}")


def _batch(work: workloads.Workload) -> torch.Tensor:
    """The step's input, taken from the model's first call."""
    seen: list[torch.Tensor] = []
    handle = work.model.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        work.step()
    finally:
        handle.remove()
    return seen[0]


if __name__ == "__main__":
    main()

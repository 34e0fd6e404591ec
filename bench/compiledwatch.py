"""What watching costs a ``torch.compile``'d training step: compiled steps untraced against the
same steps watched by hooktrace (the steps after its recorded ones, which run compiled), on a
small transformer and on resnet18.

    .venv/bin/python -m bench.compiledwatch [--rounds 5] [--steps 10] [--backend inductor]
                                            [--threads 1]

Each round times ``--steps`` steps untraced and as many watched, interleaved, in CPU seconds of
this process (the model is compiled once, before the first round; each traced round records
one step eagerly first, untimed), with one torch thread by default: the CPU seconds of several
threads count their spinning, which other load on the machine inflates. Prints the median
ratio per model against the target (watched <= 1.05x untraced) and the graphs compiled, to
show tracing made no recompile. Writes no results file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import hooktrace

TARGET = 1.05
Step = Callable[[], None]


def transformer(backend: str) -> Step:
    """A 4-layer pre-norm transformer encoder (d=128, 4 heads) with a token head, AdamW."""
    torch.manual_seed(0)
    vocab, length = 256, 64
    model = nn.Sequential(
        nn.Embedding(vocab, 128),
        nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 512, batch_first=True,
                                                         norm_first=True), 4),
        nn.Linear(128, vocab))
    data = torch.randint(0, vocab, (8, length + 1))
    return _step(torch.compile(model, backend=backend),
                 torch.optim.AdamW(model.parameters(), lr=1e-4),
                 lambda out: F.cross_entropy(out.reshape(-1, vocab), data[:, 1:].reshape(-1)),
                 data[:, :-1])


def resnet18(backend: str) -> Step:
    """torchvision's resnet18 (10 classes) on 8 images of 64x64, SGD with momentum."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    return _step(torch.compile(model, backend=backend),
                 torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                 lambda out: F.cross_entropy(out, y), x)


def _step(compiled: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
          loss: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Step:
    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(compiled(x)).backward()
        optimizer.step()
    return step


def timed(step: Step, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        step()
    return time.process_time() - start


def graphs() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def measure(name: str, step: Step, folder: Path, rounds: int, steps: int
            ) -> tuple[float, float, float, int]:
    """Median untraced and watched CPU seconds per step, their ratio, graphs compiled while
    traced."""
    for _ in range(3):  # compiled here, not in a timed round
        step()
    plain, watched = [], []
    before = graphs()
    for r in range(rounds):
        plain.append(timed(step, steps))
        with hooktrace.trace(folder / f"{name}-{r}.jsonl", steps="0:1"):
            step()  # recorded, eagerly
            watched.append(timed(step, steps))
        print(f"{name} round {r}: {plain[-1]:.3f} s untraced, {watched[-1]:.3f} s watched",
              file=sys.stderr)
    p, w = statistics.median(plain) / steps, statistics.median(watched) / steps
    return p, w, w / p, graphs() - before


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compiledwatch", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and kind")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | untraced s/step | watched s/step | ratio | target | graphs compiled "
          "while traced |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("transformer", transformer), ("resnet18", resnet18)):
            p, w, ratio, compiled = measure(name, make(args.backend), Path(tmp), args.rounds,
                                            args.steps)
            verdict = "met" if ratio <= TARGET else "missed"
            print(f"| {name} | {p:.4f} | {w:.4f} | {ratio:.3f}x | <= {TARGET}x ({verdict}) | "
                  f"{compiled} |")


if __name__ == "__main__":
    main()

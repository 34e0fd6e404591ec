"""Interleaved timing: every variant runs in every round, so drift and the other load on a shared
machine hit all of them alike, and only ratios between them are trusted.

A round opens each variant's session in turn (a balanced order, see balanced_order), runs
``warmup`` untimed steps in it (the first step of a session names the model and fills caches),
then ``block`` timed steps, and closes it. Sessions cannot stay open across the other variants'
steps: every variant hooks every module call in the process.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import io
import pstats
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.logtools import LogSummary, summarize_log
from bench.variants import Variant
from bench.workloads import Workload


class GcClock:
    """Time spent in garbage collection, and how many full (generation 2) collections ran.

    A full collection with torch imported takes 0.1-0.3 s; it lands in whichever step is
    running, so it shows in means, not in medians."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        if info["generation"] == 2:
            self.full += 1

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def least(fn: Callable[[], Any], repeat: int = 20, number: int = 1) -> float:
    """The least time of ``repeat`` runs of ``number`` calls, per call, in seconds (what the
    work costs on a shared machine, not what a busy moment made of it)."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - began) / number)
    return best


@dataclass
class Samples:
    """What one variant measured on one workload, in seconds per timed step."""

    cpu: list[float] = field(default_factory=list)  # process CPU time (one thread: no overlap)
    wall: list[float] = field(default_factory=list)
    gc: list[float] = field(default_factory=list)  # garbage collection inside the step
    full_gcs: int = 0
    session: list[float] = field(default_factory=list)  # opening + closing it (wall), no steps
    logs: list[LogSummary] = field(default_factory=list)


def _timed_step(step: Callable[[], None], sync: Callable[[], None], clock: GcClock,
                into: Samples) -> None:
    gc_seconds, full = clock.seconds, clock.full
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    sync()
    into.cpu.append(time.process_time() - cpu)
    into.wall.append(time.perf_counter() - wall)
    into.gc.append(clock.seconds - gc_seconds)
    into.full_gcs += clock.full - full


def _session(workload: Workload, variant: Variant, log: Path, warmup: int, block: int,
             sync: Callable[[], None], clock: GcClock, into: Samples | None) -> None:
    """Open the variant, run warm-up then timed steps, close it; ``into=None``: time nothing."""
    with contextlib.ExitStack() as session:
        start = time.perf_counter()
        session.enter_context(variant.open(workload.model, log))
        opening = time.perf_counter() - start
        for _ in range(warmup):
            workload.step()
        sync()
        for _ in range(block):
            if into is None:
                workload.step()
            else:
                _timed_step(workload.step, sync, clock, into)
        start = time.perf_counter()
    closing = time.perf_counter() - start
    if into is not None:
        into.session.append(opening + closing)
        if variant.writes_log:
            into.logs.append(summarize_log(log))
    log.unlink(missing_ok=True)


def balanced_order(n: int, r: int) -> list[int]:
    """Round ``r``'s order of ``n`` variants: a Williams Latin square (0 1 n-1 2 n-2 ..., plus
    r). Over n rounds (n even) each variant comes right after each other variant once, so what
    one variant leaves behind (freed memory, a cold cache, a pending collection) does not
    always fall on the same next variant, as it would if the order only rotated."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    return [(i + r) % n for i in first]


def interleave(workload: Workload, variants: Sequence[Variant], rounds: int, folder: Path,
               sync: Callable[[], None]) -> dict[str, Samples]:
    """Run ``rounds`` rounds of every variant after one unmeasured round (first-use costs:
    the profiler takes ~1 s to start the first time)."""
    schedule = workload.schedule
    samples = {v.name: Samples() for v in variants}
    with GcClock() as clock:
        for variant in variants:
            _session(workload, variant, folder / "prime.jsonl", schedule.warmup, 1, sync,
                     clock, None)
        gc.collect()  # the garbage of building the models is not any variant's
        for r in range(rounds):
            for variant in (variants[i] for i in balanced_order(len(variants), r)):
                log = folder / f"{workload.name}-{variant.name}-{r}.jsonl"
                _session(workload, variant, log, schedule.warmup, schedule.block, sync, clock,
                         samples[variant.name])
    return samples


def syncs_per_step(workload: Workload, variant: Variant, steps: int, folder: Path) -> float:
    """Synchronising CUDA calls per step under ``variant`` (torch's sync debug mode warns on
    each), after one step that is not counted (naming the model)."""
    import torch

    with variant.open(workload.model, folder / "syncs.jsonl"):
        workload.step()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(steps):
                    workload.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    (folder / "syncs.jsonl").unlink(missing_ok=True)
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def cprofile(workload: Workload, variant: Variant, steps: int, folder: Path,
             top: int = 25) -> str:
    """The functions that dominate ``steps`` steps under ``variant`` (by own time), as text.

    Profiled with the garbage collector off: cProfile bills a collection to whichever function
    happened to allocate, which ranks innocent functions first. The collections' cost is
    measured apart, over as many steps without the profiler, and printed first."""
    with variant.open(workload.model, folder / "cprofile.jsonl"), GcClock() as clock:
        workload.step()  # naming the model is a once-per-session cost
        start = time.process_time()
        for _ in range(steps):
            workload.step()
        seconds = time.process_time() - start
        profile = cProfile.Profile()
        gc.disable()
        try:
            profile.enable()
            for _ in range(steps):
                workload.step()
            profile.disable()
        finally:
            gc.enable()
    out = io.StringIO()
    print(f"{variant.name} on {workload.name}, {steps} steps without the profiler: "
          f"{seconds:.3f} s CPU, of which {clock.seconds:.3f} s garbage collection "
          f"({clock.full} full collections). Profile below: {steps} more steps, GC off.",
          file=out)
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()

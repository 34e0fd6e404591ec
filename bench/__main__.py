"""hooktrace's benchmark: tracing overhead against untraced, the floor and other tracers, and
the cost of ``check`` / ``render`` on big logs. See bench/README.md.

    .venv/bin/python -m bench [--quick] [--workloads W1,W2] [--out bench/results]

Prints a markdown table and writes ``bench.json`` + ``bench.md`` (``bench-quick.*`` with
--quick) into --out. Not part of the test suite: it takes minutes and its numbers are ratios
measured on a possibly shared machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import torch

import hooktrace
from bench import logtools, measure, report, tables, targets, unrolled, variants, workloads

_ROOT = Path(__file__).resolve().parent.parent
_FULL_LOG_SIZES = (10_000, 100_000, 1_000_000)
_QUICK_LOG_SIZES = (10_000, 100_000)
_EXPORT_STEPS = 5  # steps in the profile whose export is timed
_SYNC_STEPS = 5  # steps whose device synchronisations are counted (GPU runs)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="few rounds, logs up to 1e5 events (a smoke test, ~2 minutes)")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated, from W1,W2,W3,W4 (default: all; W3,W4 on cuda)")
    parser.add_argument("--out", type=Path, default=_ROOT / "bench" / "results")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per workload "
                                                    "(default: each workload's own)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--skip-logs", action="store_true",
                        help="do not measure check/render/view on logs")
    parser.add_argument("--logs-only", action="store_true",
                        help="measure check/render/view on logs only (big W2 logs, the unrolled "
                             "loop), no training step")
    parser.add_argument("--unrolled", action="store_true",
                        help="measure only the unrolled-loop logs (check/view/render by calls "
                             "per step); writes bench-unrolled.json/.md")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants to measure (default: all; untraced, the "
                             "floor and hooktrace are always measured: ratios are against the "
                             "first two, and hooktrace's log counts the events per step)")
    parser.add_argument("--observers", action="store_true",
                        help="what each observer adds: hooktrace with each left out in turn, "
                             "recorded and watched steps (default W1,W2; no logs); writes "
                             "bench-observers.json/.md")
    parser.add_argument("--cprofile", nargs="?", const="hooktrace", metavar="VARIANT",
                        help="only print a cProfile of 20 steps of the first workload under "
                             "VARIANT (default hooktrace)")
    args = parser.parse_args(argv)
    default = "W3,W4" if args.device == "cuda" else "W1,W2" if args.observers \
        else ",".join(workloads.NAMES)
    args.workloads = (args.workloads or default).split(",")
    unknown = set(args.workloads) - set(workloads.NAMES)
    if unknown:
        parser.error(f"unknown workload(s) {sorted(unknown)}; choose from {workloads.NAMES}")
    names = [v.name for v in variants.VARIANTS]
    if args.unrolled:
        args.logs_only = True
    if args.observers:
        args.skip_logs = True
        # with ModuleTracker and the bare reductions: every recorded-step target in one run
        args.variants = ",".join(["hooktrace_nostats", "hooktrace_watched", "moduletracker",
                                  "floor_stats", *(
            v.name for v in variants.VARIANTS if v.extra)])
    args.variants = ({"untraced", "floor", "hooktrace", *args.variants.split(",")} if args.variants
                     else {v.name for v in variants.VARIANTS if not v.extra})
    if args.variants - set(names):
        parser.error(f"unknown variant(s) {sorted(args.variants - set(names))}; choose from "
                     f"{names}")
    return args


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=_ROOT,
                            capture_output=True, text=True).stdout.strip()
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
        "torch": torch.__version__, "hooktrace": hooktrace.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "device": args.device,
        "quick": args.quick, "argv": sys.argv[1:],
        "load_before": round(os.getloadavg()[0], 2),
    }


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def bench_workload(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Measure every variant on one workload, interleaved; summarise."""
    started = time.perf_counter()
    device = torch.device(args.device)
    workload = workloads.build(name, device)
    schedule = workload.schedule
    rounds = args.rounds or (schedule.quick_rounds if args.quick else schedule.rounds)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timer = "wall" if device.type == "cuda" else "cpu"  # the issue quotes CPU time; GPU: wall
    chosen = [v for v in variants.VARIANTS
              if v.runs_on(name, device.type) and v.name in args.variants]
    _progress(f"{name}: {rounds} rounds of {len(chosen)} variants")
    samples = measure.interleave(workload, chosen, rounds, folder, sync)
    per_step = report.events_per_step(samples)
    rows = report.summarize(samples, per_step, timer)
    for variant in chosen:
        rows[variant.name]["label"] = variant.label
        if device.type == "cuda" and variant.name != "profiler":
            rows[variant.name]["syncs_per_step"] = measure.syncs_per_step(
                workload, variant, _SYNC_STEPS, folder)
    return {
        "description": workload.description, "events_per_step": per_step, "rounds": rounds,
        "block": schedule.block, "warmup": schedule.warmup, "timer": timer,
        "profiler_export_steps": _EXPORT_STEPS,
        "profiler_export_s": variants.export_cost(workload.step, _EXPORT_STEPS, folder),
        "variants": rows, "seconds": time.perf_counter() - started,
        "samples_ms": {n: {"cpu": [round(t * 1e3, 4) for t in s.cpu],
                           "wall": [round(t * 1e3, 4) for t in s.wall],
                           "gc": [round(t * 1e3, 4) for t in s.gc]} for n, s in samples.items()},
    }


def bench_logs(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    sizes = _QUICK_LOG_SIZES if args.quick else _FULL_LOG_SIZES
    _progress(f"check/render on logs of {', '.join(f'{s:,}' for s in sizes)} events")
    w2 = workloads.build("W2", torch.device("cpu"))
    template = logtools.make_template(w2.model, w2.step, folder)
    return logtools.measure_tools(template, sizes, 1 if args.quick else 3, folder)


def _write(results: dict[str, Any], text: str, args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("bench-observers" if args.observers else "bench-unrolled" if args.unrolled
            else "bench-quick" if args.quick else "bench")
    (args.out / f"{stem}.json").write_bytes(
        orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    (args.out / f"{stem}.md").write_text(text)
    _progress(f"wrote {args.out / stem}.json and .md")


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hooktrace-bench-") as tmp:
        folder = Path(tmp)
        if args.cprofile:
            workload = workloads.build(args.workloads[0], torch.device(args.device))
            variant = {v.name: v for v in variants.VARIANTS}[args.cprofile]
            print(measure.cprofile(workload, variant, 20, folder))
            return
        results: dict[str, Any] = {"meta": _meta(args), "workloads": {}, "log_tools": []}
        for name in [] if args.logs_only else args.workloads:
            results["workloads"][name] = bench_workload(name, args, folder)
            _progress(f"{name}: {results['workloads'][name]['seconds']:.0f} s")
        if not args.skip_logs:
            results["log_tools"] = [] if args.unrolled else bench_logs(args, folder)
            results["unrolled"] = unrolled.measure(args.quick, folder, _progress)
    results["meta"]["load_after"] = round(os.getloadavg()[0], 2)
    results["meta"]["seconds"] = time.perf_counter() - started
    results["targets"] = targets.evaluate(results)
    text = tables.document(results)
    print(text)
    _write(results, text, args)


if __name__ == "__main__":
    main()

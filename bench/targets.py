"""The targets of issue 6 / DESIGN.md, judged on one run's results: met, not met, or not measured.

A ratio target is met only when both the median and the mean are within it: the mean is where
per-step garbage (full collections of 0.1-0.3 s) shows, and the median is what noise spares.
"""

from __future__ import annotations

import math
from typing import Any

Verdict = dict[str, Any]  # {"target": str, "met": bool | None, "measured": str}


def _verdict(target: str, met: bool | None, measured: str) -> Verdict:
    return {"target": target, "met": met, "measured": measured}


def _row(results: dict[str, Any], workload: str, variant: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = (
        results["workloads"].get(workload, {}).get("variants", {}).get(variant))
    return row


def _vs_floor(results: dict[str, Any], variant: str, limit: float) -> Verdict:
    row = _row(results, "W1", variant)
    target = (f"W1: {'stats on' if variant == 'hooktrace' else 'stats off'} adds "
              f"<= {limit}x the floor's added time")
    if row is None:
        return _verdict(target, None, "not measured (W1 not run)")
    median, mean = row["x_floor_added_median"], row["x_floor_added_mean"]
    low, high = row["x_floor_added_median_ci90"]
    measured = f"{median:.2f}x median (90% interval {low:.2f}-{high:.2f}), {mean:.2f}x mean"
    if variant == "hooktrace":
        measured += _reductions(results, "W1", "x_floor_added", ".2f")
    return _verdict(target, median <= limit and mean <= limit, measured)


def _reductions(results: dict[str, Any], workload: str, key: str, fmt: str) -> str:
    """What the bare reductions of the statistics cost on their own (the floor_stats variant):
    the least any tracer pays for these numbers."""
    row = _row(results, workload, "floor_stats")
    if row is None:
        return ""
    return (f"; the floor with the statistics' bare reductions alone: "
            f"{row[key + '_median']:{fmt}}x / {row[key + '_mean']:{fmt}}x")


def _below_tracker(results: dict[str, Any]) -> Verdict:
    target = "W1: hooktrace adds less than ModuleTracker, stats on and off"
    rows = {v: _row(results, "W1", v) for v in ("hooktrace", "hooktrace_nostats", "moduletracker")}
    if any(r is None for r in rows.values()):
        return _verdict(target, None, "not measured (W1 not run)")
    met, parts = True, []
    for name, row in rows.items():
        assert row is not None
        med, mean = row["added_us_per_event_median"], row["added_us_per_event_mean"]
        parts.append(f"{name} {med:.1f} / {mean:.1f}")
        if name != "moduletracker":
            tracker = rows["moduletracker"]
            assert tracker is not None
            met = met and med < tracker["added_us_per_event_median"] \
                and mean < tracker["added_us_per_event_mean"]
    return _verdict(target, met, "added us/event (median / mean): " + ", ".join(parts))


def _vs_untraced(results: dict[str, Any], workload: str, limit: float,
                 variant: str = "hooktrace") -> Verdict:
    """A variant's traced step against untraced; ``hooktrace`` also quotes stats off."""
    row, off = _row(results, workload, variant), _row(results, workload, "hooktrace_nostats")
    target = (f"{workload}: traced step (stats on) <= {limit:.2f}x untraced" if variant ==
              "hooktrace" else f"{workload}, a long run past its recorded steps (watched: "
              f"NaN/Inf checks, no events) <= {limit:.2f}x untraced")
    if row is None:
        return _verdict(target, None, f"not measured ({workload} or {variant} not run)")
    median, mean = row["x_untraced_median"], row["x_untraced_mean"]
    low, high = row["x_untraced_median_ci90"]
    measured = f"{median:.3f}x median (90% interval {low:.3f}-{high:.3f}), {mean:.3f}x mean"
    if variant == "hooktrace" and off is not None:
        measured += (f"; stats off {off['x_untraced_median']:.3f}x / "
                     f"{off['x_untraced_mean']:.3f}x")
    floor = _row(results, workload, "floor")
    if floor is not None:
        measured += (f"; the floor (no-op hooks) {floor['x_untraced_median']:.3f}x / "
                     f"{floor['x_untraced_mean']:.3f}x")
    measured += _reductions(results, workload, "x_untraced", ".3f")
    return _verdict(target, median <= limit and mean <= limit, measured)


def _zoomed(results: dict[str, Any], limit: float = 7.0) -> Verdict:
    """A resnet18 step with layer1's calls zoomed (``--ops 'layer1*'``) against TorchLens's
    whole-step trace, about 7x a step; with what each zoomed call adds to a traced step."""
    row, whole = _row(results, "W2", "hooktrace_zoomed"), _row(results, "W2", "hooktrace")
    target = f"W2 with --ops 'layer1*': traced step <= {limit:g}x untraced (TorchLens: ~7x)"
    if row is None or whole is None:
        return _verdict(target, None, "not measured (W2 or hooktrace_zoomed not run)")
    median, mean = row["x_untraced_median"], row["x_untraced_mean"]
    calls = row.get("zoomed_calls_per_step", 0.0)
    added = row["median_ms"] - whole["median_ms"]
    per_call = f", {added / calls:.3f} ms per zoomed call" if calls else ""
    return _verdict(target, median <= limit and mean <= limit,
                    f"{median:.3f}x median, {mean:.3f}x mean; over the traced step "
                    f"{row['median_ms'] / whole['median_ms']:.3f}x (+{added:.2f} ms for "
                    f"{calls:g} zoomed calls a step{per_call})")


def _log_size(results: dict[str, Any]) -> Verdict:
    row = _row(results, "W2", "hooktrace")
    target = "W2: <= 120 bytes of log per event (stats on)"
    if row is None:
        return _verdict(target, None, "not measured (W2 not run)")
    size = row["log_bytes_per_event"]
    return _verdict(target, size <= 120,
                    f"{size:.0f} B/event in per-step records (events, params, step); event "
                    f"lines alone {row['event_line_bytes']:.0f} B; plus "
                    f"{row['log_one_off_kb']:.0f} kB once per log (header, modules)")


def _tool(results: dict[str, Any], tool: str) -> Verdict:
    target = f"{tool} on 1e6 events: peak memory < 300 MB, time <= 2x a bare orjson parse"
    rows = [r for r in results["log_tools"] if r["events"] >= 1_000_000]
    mine = [r for r in rows if r["tool"] == tool]
    if not mine:
        return _verdict(target, None, "not measured (no log of 1e6 events in this run)")
    row, parse = mine[-1], [r for r in rows if r["tool"] == "parse"][-1]
    return _verdict(target, row["peak_mb"] < 300 and row["x_parse"] <= 2,
                    f"{row['peak_mb']:.0f} MB peak, {row['x_parse']:.2f}x the parse's CPU time "
                    f"({row['cpu_s']:.2f} s vs {parse['cpu_s']:.2f} s)")


def _unrolled_flat(results: dict[str, Any], limit: float = 2.0) -> Verdict:
    """Time per event of check and view at every calls-per-step size, within ``limit``x:
    linear in the calls of a step (render's spread is shown: it draws one step, so a bigger
    step is more of its work, not a worse rate)."""
    target = (f"unrolled loop, 100 / 1,000 / 10,000 calls per step: check and view time per "
              f"event within {limit:g}x of each other")
    rows = results.get("unrolled", {}).get("sizes", [])
    if not rows:
        return _verdict(target, None, "not measured (logs skipped)")
    met, parts = True, []
    for tool in dict.fromkeys(r["tool"] for r in rows):
        times = [r["us_per_event"] for r in rows if r["tool"] == tool]
        spread = max(times) / min(times)
        met = met and (spread <= limit or tool == "render")
        parts.append(f"{tool} {' / '.join(f'{t:.1f}' for t in times)} us ({spread:.2f}x)")
    return _verdict(target, met, "; ".join(parts))


def _unrolled_issue(results: dict[str, Any], limit: float = 5.0) -> Verdict:
    target = (f"the issue's unrolled log (999 time steps x 3 modules, 10 steps, 60k events): "
              f"check < {limit:g} s")
    rows = [r for r in results.get("unrolled", {}).get("issue", []) if r["tool"] == "check"]
    if not rows:
        return _verdict(target, None, "not measured (logs skipped)")
    r = rows[0]
    others = ", ".join(f"{o['tool']} {o['cpu_s']:.2f} s" for o in
                       results["unrolled"]["issue"] if o["tool"] != "check")
    return _verdict(target, r["cpu_s"] < limit,
                    f"{r['cpu_s']:.2f} s CPU ({r['wall_s']:.2f} s wall) for {r['events']:,} "
                    f"events; {others}")


def _gpu(results: dict[str, Any]) -> Verdict:
    target = "GPU, W4: statistics on cost <= 5% steps/s; no per-module device sync"
    on, off = _row(results, "W4", "hooktrace"), _row(results, "W4", "hooktrace_nostats")
    if results["meta"]["device"] != "cuda" or on is None or off is None:
        return _verdict(target, None, "not measured (no CUDA run)")
    cost = 1 - off["median_ms"] / on["median_ms"]  # steps/s lost to statistics
    base = _row(results, "W4", "untraced")
    syncs = on.get("syncs_per_step", math.nan) - (base or {}).get("syncs_per_step", math.nan)
    events = results["workloads"]["W4"]["events_per_step"]
    return _verdict(target, cost <= 0.05 and syncs <= 1,
                    f"stats on costs {cost:.1%} steps/s (median); {syncs:g} device syncs "
                    f"per step added (untraced: {base and base.get('syncs_per_step')}), "
                    f"for {events:g} events")


def evaluate(results: dict[str, Any]) -> list[Verdict]:
    return [
        _vs_floor(results, "hooktrace_nostats", 1.5),
        _vs_floor(results, "hooktrace", 2.0),
        _below_tracker(results),
        _vs_untraced(results, "W4", 1.03),
        _vs_untraced(results, "W2", 1.10),
        _vs_untraced(results, "W3", 1.10),
        # watched steps, what a long run pays for hours
        _vs_untraced(results, "W1", 1.6, "hooktrace_watched"),
        _vs_untraced(results, "W2", 1.03, "hooktrace_watched"),
        _vs_untraced(results, "W3", 1.03, "hooktrace_watched"),
        _vs_untraced(results, "W4", 1.03, "hooktrace_watched"),
        _zoomed(results),
        _log_size(results),
        _tool(results, "check"),
        _tool(results, "render"),
        _unrolled_flat(results),
        _unrolled_issue(results),
        _gpu(results),
    ]

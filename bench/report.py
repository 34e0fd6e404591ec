"""Numbers from samples: medians, means, ratios to untraced and to the floor, and the targets.

Ratios, not absolute times, are what this machine can vouch for (it is shared and noisy): every
ratio compares variants measured in the same interleaved rounds. A ratio's 90% interval comes
from resampling each variant's steps (bootstrap), so a verdict near its limit can be read as
the coin toss it is.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from bench.measure import Samples


def _added(variant: float, untraced: float, floor: float) -> float:
    """A variant's added time as a multiple of the floor's added time."""
    return (variant - untraced) / (floor - untraced) if floor != untraced else float("nan")


def _interval(groups: dict[str, list[float]], ratio: Callable[[dict[str, float]], float],
              resamples: int = 300) -> list[float]:
    """90% bootstrap interval of ``ratio`` of the groups' medians."""
    rng = random.Random(0)
    values = sorted(
        ratio({k: statistics.median(rng.choices(v, k=len(v))) for k, v in groups.items()})
        for _ in range(resamples)
    )
    return [values[int(0.05 * resamples)], values[int(0.95 * resamples) - 1]]


def _log_fields(samples: Samples) -> dict[str, Any]:
    logs = samples.logs
    events = sum(log.events for log in logs)
    if not events:
        return {}
    zoomed = sum(log.zoomed for log in logs)
    return {
        **({"zoomed_calls_per_step": zoomed / sum(log.steps for log in logs)} if zoomed else {}),
        "log_bytes_per_event": sum(log.step_bytes for log in logs) / events,
        "event_line_bytes": sum(log.event_bytes for log in logs) / events,
        "log_one_off_kb": statistics.mean(log.total_bytes - log.step_bytes for log in logs)
        / 1024,
    }


def summarize(samples: dict[str, Samples], events_per_step: float, timer: str
              ) -> dict[str, dict[str, Any]]:
    """One row per variant; ``timer`` is ``cpu`` (CPU runs) or ``wall`` (GPU runs)."""
    times = {name: getattr(s, timer) for name, s in samples.items()}
    base, floor = times["untraced"], times["floor"]
    rows: dict[str, dict[str, Any]] = {}
    for name, t in times.items():
        row: dict[str, Any] = {"timed_steps": len(t)}
        for label, center in (("median", statistics.median), ("mean", statistics.mean)):
            b, f, v = center(base), center(floor), center(t)
            row[f"{label}_ms"] = v * 1e3
            row[f"x_untraced_{label}"] = v / b
            row[f"added_us_per_event_{label}"] = (v - b) / events_per_step * 1e6
            row[f"x_floor_added_{label}"] = _added(v, b, f)
        pair = {"u": base, "v": t}
        row["x_untraced_median_ci90"] = _interval(pair, lambda m: m["v"] / m["u"])
        if name not in ("untraced", "floor"):
            row["x_floor_added_median_ci90"] = _interval(
                {**pair, "f": floor}, lambda m: _added(m["v"], m["u"], m["f"]))
        s = samples[name]
        row["gc_ms_per_step"] = statistics.mean(s.gc) * 1e3
        row["full_gcs"] = s.full_gcs
        row["session_ms"] = statistics.median(s.session) * 1e3
        row.update(_log_fields(s))
        rows[name] = row
    return rows


def events_per_step(samples: dict[str, Samples]) -> float:
    """Module events per step, counted by hooktrace itself (end record: events / steps)."""
    logs = samples["hooktrace"].logs
    return sum(log.events for log in logs) / sum(log.steps for log in logs)

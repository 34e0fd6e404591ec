"""The results as markdown: one table per workload, the log-tools table, the target verdicts."""

from __future__ import annotations

from typing import Any

_HEAD = ("| variant | median ms | mean ms | x untraced (med / mean) | added us/event (med / mean) "
         "| x floor's added (med / mean) | GC ms/step | full GCs | session ms | log B/event |")

_REFERENCE = {  # what issue 6 measured (its floor hooked differently: bench/README.md)
    "W1": "Issue 6 reference (W1, CPU time, one thread): untraced 15.4 ms/step; added us/event: "
          "floor 10.5 (1.55x), ModuleTracker 23.5, torch.profiler(record_shapes) 11.8 "
          "(+0.4 s per export).",
}


def _pair(row: dict[str, Any], key: str, fmt: str) -> str:
    return f"{row[key + '_median']:{fmt}} / {row[key + '_mean']:{fmt}}"


def _variant_line(name: str, row: dict[str, Any]) -> str:
    no_floor = name in ("untraced", "floor")
    size = row.get("log_bytes_per_event")
    cells = [
        row["label"], f"{row['median_ms']:.1f}", f"{row['mean_ms']:.1f}",
        _pair(row, "x_untraced", ".3f"),
        "" if name == "untraced" else _pair(row, "added_us_per_event", ".1f"),
        "" if no_floor else _pair(row, "x_floor_added", ".2f"),
        f"{row['gc_ms_per_step']:.1f}", str(row["full_gcs"]), f"{row['session_ms']:.1f}",
        "" if size is None else f"{size:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def workload_table(name: str, w: dict[str, Any]) -> str:
    timer = "CPU time" if w["timer"] == "cpu" else "wall time"
    lines = [
        f"### {name}: {w['description']}",
        "",
        f"{w['events_per_step']:.0f} module events per step; {w['rounds']} interleaved rounds, "
        f"{w['block']} timed step(s) per variant per round after {w['warmup']} warm-up step(s); "
        f"{timer} per training step. torch.profiler's export_chrome_trace of "
        f"{w['profiler_export_steps']} steps: {w['profiler_export_s']:.2f} s.",
        "",
        _HEAD,
        "|" + "---|" * _HEAD.count(" | ") + "---|",
    ]
    lines += [_variant_line(n, row) for n, row in w["variants"].items()]
    syncs = [f"{row['label']} {row['syncs_per_step']:g}" for row in w["variants"].values()
             if "syncs_per_step" in row]
    if syncs:
        lines += ["", "Device synchronisations per step (torch.cuda sync debug mode): "
                  + ", ".join(syncs) + "."]
    if name in _REFERENCE:
        lines += ["", _REFERENCE[name]]
    return "\n".join(lines)


def tools_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "### check and render on generated logs (W2 records), against a bare orjson parse",
        "",
        "| events | file MB | command | CPU s | wall s | x parse (CPU) | peak MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['events']:,} | {r['file_mb']:.1f} | {r['tool']} | {r['cpu_s']:.2f} "
                     f"| {r['wall_s']:.2f} | {r['x_parse']:.2f} | {r['peak_mb']:.0f} |")
    return "\n".join(lines)


def unrolled_table(found: dict[str, Any]) -> str:
    lines = [
        "### The unrolled loop: check, view, render by calls per step (time_sequence_prediction's "
        "LSTMCell x2 + Linear)",
        "",
        "| calls per step | steps | events | file MB | command | CPU s | wall s | us/event (CPU) "
        "| peak MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*found["sizes"], *found["issue"]]:
        lines.append(f"| {r['calls_per_step']:,} | {r['steps']} | {r['events']:,} "
                     f"| {r['file_mb']:.1f} | {r['tool']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} "
                     f"| {r['us_per_event']:.1f} | {r['peak_mb']:.0f} |")
    return "\n".join(lines)


def observers_table(results: dict[str, Any]) -> str:
    """What each observer adds to a step: the whole session's median step time less the one
    without it, in ms and in percent of the untraced step (recorded steps; watched steps for
    the watch and for all observers)."""
    lines = ["### What each observer adds per step (hooktrace minus hooktrace without it; "
             "medians)", ""]
    workloads = list(results["workloads"].items())
    lines.append("| left out | " + " | ".join(f"{name}: x untraced without it | {name}: adds "
                                               f"ms/step (% of untraced)" for name, _ in workloads)
                 + " |")
    lines.append("|---|" + "---|---|" * len(workloads))
    rows: list[tuple[str, str, str]] = [("(nothing: the whole session)", "hooktrace", "")]
    for name, v in ((n, v) for n, w in workloads[:1] for n, v in w["variants"].items()):
        if name.startswith("without_"):
            rows.append((v["label"].removeprefix("hooktrace without "), name, "hooktrace"))
    rows.append(("statistics (stats=False)", "hooktrace_nostats", "hooktrace"))
    rows.append(("watched steps: nothing", "hooktrace_watched", ""))
    for name, v in ((n, v) for n, w in workloads[:1] for n, v in w["variants"].items()):
        if name.startswith("watched_without_"):
            rows.append((f"watched steps: {v['label'].removeprefix('watched, without ')}",
                         name, "hooktrace_watched"))
    for label, variant, whole in rows:
        cells = [label]
        for _, w in workloads:
            row, base = w["variants"].get(variant), w["variants"]["untraced"]
            if row is None:
                cells += ["", ""]
                continue
            cells.append(f"{row['x_untraced_median']:.3f}")
            if whole:
                added = w["variants"][whole]["median_ms"] - row["median_ms"]
                cells.append(f"{added:+.2f} ({added / base['median_ms']:+.1%})")
            else:
                cells.append(f"{row['median_ms'] - base['median_ms']:+.2f} (all it adds)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_list(verdicts: list[dict[str, Any]]) -> str:
    words = {True: "**met**", False: "**NOT MET**", None: "not measured"}
    lines = ["### Targets", ""]
    lines += [f"- {words[v['met']]}: {v['target']}: {v['measured']}" for v in verdicts]
    return "\n".join(lines)


def document(results: dict[str, Any]) -> str:
    meta = results["meta"]
    parts = [
        f"## hooktrace benchmark ({'quick' if meta['quick'] else 'full'} run)",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, python "
        f"{meta['python']}, {meta['device']}, {meta['threads']} thread, {meta['cpus']} CPUs, "
        f"load average {meta['load_before']} before / {meta['load_after']} after; "
        f"{meta['seconds']:.0f} s.",
    ]
    parts += [workload_table(n, w) for n, w in results["workloads"].items()]
    if any(n.startswith("without_") for w in results["workloads"].values()
           for n in w["variants"]):
        parts.append(observers_table(results))
    if results["log_tools"]:
        parts.append(tools_table(results["log_tools"]))
    if results.get("unrolled"):
        parts.append(unrolled_table(results["unrolled"]))
    parts.append(targets_list(results["targets"]))
    return "\n\n".join(parts) + "\n"

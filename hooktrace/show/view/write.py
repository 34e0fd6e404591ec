"""``hooktrace view``: a run's logs as one self-contained HTML page (``view_page``: call graphs
by step, the gradient-flow heatmap, check's findings), or the heatmap alone as a picture
(``heatmap_picture``), written by ``write_view``. Reading the log never imports torch; the
pictures need Graphviz ``dot``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.check.checklog import check_collected, check_readers
from hooktrace.check.collect import Collector
from hooktrace.check.findings import Finding, Report
from hooktrace.check.report import where
from hooktrace.log.discovery import expand, open_ranks
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.log.words import fqn_text, plural
from hooktrace.show.output import choose_format, default_output, mark, write_file
from hooktrace.show.render.dot import Laid, dot_missing
from hooktrace.show.view.data import MAX_GRAPH_STEPS, Gatherer, RunData, gather
from hooktrace.show.view.graphs import step_graphs
from hooktrace.show.view.heatmap import VALUES, Heatmap, heatmap, heatmap_dot, legend_items, to_html
from hooktrace.show.view.page import page

FORMATS = ("html", "svg", "png")


@dataclass(slots=True)
class Viewed:
    path: Path
    format: str
    size: int
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"wrote {self.path} ({self.format}, {self.size / 1024:.0f} KB)"


@dataclass(slots=True)
class HeatmapPicture(Laid):
    """The heatmap as DOT; a notebook shows it as SVG."""

    source: str
    warnings: list[str] = field(default_factory=list)  # the log's: cut off, no end record


def _mine(findings: Sequence[Finding], rank: int) -> list[Finding]:
    return [f for f in findings if f.ranks is None or rank in f.ranks]


def heatmap_picture(logs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                    values: str = "grad_output", rank: int | None = None) -> HeatmapPicture:
    """The heatmap of one log (or of ``rank`` among the logs of one run) as a picture."""
    if values not in VALUES:
        raise HooktraceError(f"unknown values {values!r}; choose one of {', '.join(VALUES)}")
    paths = [logs] if isinstance(logs, (str, os.PathLike)) else list(logs)
    readers = open_ranks(paths)
    index = _rank_index(readers, rank)
    reader = readers[index]
    (data,), report = _read(readers, draw=0, only=index)
    heat = heatmap(data, _mine(report.findings, reader.header.rank), values)
    heat.title = f"{reader.path.name} (rank {reader.header.rank})" if len(readers) > 1 \
        else reader.path.name
    return HeatmapPicture(heatmap_dot(heat), data.warnings)


def _read(readers: Sequence[LogReader], draw: int = MAX_GRAPH_STEPS, only: int | None = None
          ) -> tuple[list[RunData], Report]:
    """What the page shows of each log (``only``: of the log at that position alone; ``draw``:
    the steps kept for the call graphs, ``Gatherer``), and check's report on them, in one pass
    over each log: one log's pass feeds check's collector; the walk that finds where the
    ranks diverge feeds each rank's collector and gatherer."""
    if len(readers) == 1:
        collector = Collector(readers[0])
        runs = [gather(readers[0], collector.take, draw)]
        return runs, check_collected(collector.finish(), path=readers[0].path)
    gatherers = [Gatherer(r, draw) if only in (None, i) else None for i, r in enumerate(readers)]
    report = check_readers(readers, feeds=[g.take if g else None for g in gatherers])
    return [g.finish() for g in gatherers if g], report


def _rank_index(readers: Sequence[LogReader], rank: int | None) -> int:
    """The position of ``rank``'s log among ``readers`` (None: the first)."""
    found = next((i for i, r in enumerate(readers) if rank is None or r.header.rank == rank),
                 None)
    if found is None:
        raise HooktraceError(f"no log of rank {rank} among the logs given")
    return found


def _anomalies(data: RunData) -> str:
    if not data.anomalies:
        return ""
    items = "".join(
        f"<li>step {a.step}: <b>{html.escape(a.kind)}</b> at "
        f"{html.escape(fqn_text(a.fqn))} ({html.escape(data.models.get(a.model, '?'))}) "
        f"call {a.call} <span class='muted'>{html.escape(str(a.detail))}</span></li>"
        for a in data.anomalies)
    return f"<h2>Watched steps: anomaly records</h2><ul>{items}</ul>"


def _rank_data(data: RunData, findings: Sequence[Finding], every_call: bool = False,
               draw: bool = True) -> tuple[dict[str, Any], Heatmap]:
    mine = _mine(findings, data.rank)
    heats = {values: heatmap(data, mine, values) for values in VALUES}
    return {
        "rank": data.rank, "models": data.model_names(),
        "graphs": step_graphs(data, mine, every_call, draw),
        "heat": {values: to_html(heat, data.rank) for values, heat in heats.items()},
        "anomalies": _anomalies(data),
    }, heats["grad_output"]


def _finding(f: Finding, heats: list[Heatmap], runs: list[RunData]) -> dict[str, Any]:
    rows: dict[str, int] = {}
    for i, (heat, data) in enumerate(zip(heats, runs, strict=True)):
        model = next((m for m, name in data.models.items() if name == f.model), None)
        if (model, f.module) in heat.rows:
            rows[str(i)] = heat.rows.index((model, f.module))  # type: ignore[arg-type]
    return {"kind": f.kind, "cause": f.cause, "severity": f.severity, "model": f.model,
            "module": f.module, "step": f.step, "where": where(f), "message": f.message,
            "hint": f.hint, "ranks": f.ranks, "rows": rows}


def _legend(heat: Heatmap) -> str:
    return "".join(f'<span style="background:{fill}">{html.escape(text)}</span>'
                   f"{html.escape(what)}" for fill, text, what in legend_items(heat)) + \
        '<span style="outline:2px solid #000"></span>named by a finding'


def view_page(logs: Sequence[str | os.PathLike[str]], rank: int | None = None,
              every_call: bool = False) -> tuple[str, list[str]]:
    """The page's HTML for one log or the ranks of one run (opening at ``rank``), and the logs'
    warnings. ``every_call``: the call graphs draw each call of a module called many times.
    Without the ``dot`` program the page has no call graphs, and a warning says why."""
    readers = open_ranks(logs, flow=True)  # the call graphs draw the data flow
    start = _rank_index(readers, rank)
    runs, report = _read(readers)
    nodot = dot_missing()
    per_rank = [_rank_data(data, report.findings, every_call, nodot is None) for data in runs]
    heats = [heat for _, heat in per_rank]
    data = {"ranks": [d for d, _ in per_rank], "start": start, "nodot": nodot,
            "findings": [_finding(f, heats, runs) for f in report.findings]}
    first = runs[0]
    header = first.header
    status = first.end.status if first.end else "no end record (cut off)"
    meta = (f"{' '.join(header.argv)} · torch {header.torch} · hooktrace {header.hooktrace} · "
            f"{plural(len(runs), 'rank')} · {plural(len(first.steps), 'recorded step')} · "
            f"{status} · {plural(len(report.problems), 'problem')}, "
            f"{plural(len(report.findings) - len(report.problems), 'note')}")
    title = readers[0].path.name if len(readers) == 1 else f"{readers[0].path.name} +ranks"
    warnings = [w for d in runs for w in d.warnings]
    if nodot:
        warnings.append(f"the page has no call graphs: {nodot}")
    return page(title, meta, data, _legend(heats[0])), warnings


def write_view(logs: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str] | None,
               fmt: str | None = None, values: str = "grad_output", rank: int | None = None,
               every_call: bool = False) -> Viewed:
    """``hooktrace view``: the page (html) or the heatmap picture (svg, png) of ``logs`` into
    ``output`` (default: the first log's name with .html, or .heatmap.svg / .heatmap.png; a
    default name never replaces a file hooktrace did not write)."""
    out = Path(output) if output is not None else None
    chosen = choose_format(fmt, out, FORMATS, "html")
    paths = expand(logs)
    # the heatmap alone is not the page, nor render's picture: a name of its own
    out = out or default_output(paths[0].with_suffix(
        ".html" if chosen == "html" else f".heatmap.{chosen}"))
    if chosen == "html":
        text, warnings = view_page(logs, rank, every_call)
        data = text.encode("utf-8")
    else:
        picture = heatmap_picture(logs, values, rank)
        data, warnings = picture.pipe(chosen), picture.warnings
    write_file(out, mark(data, chosen), paths[0])
    return Viewed(out, chosen, len(data), warnings)

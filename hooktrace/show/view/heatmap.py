"""The gradient-flow heatmap: modules (rows, forward order) by steps (columns), coloured by
log10 of the gradient norm, with NaN/Inf, "no gradient", findings and anomalies marked.

``heatmap`` builds the cells once; ``to_html`` writes them as the page's table and
``heatmap_dot`` as a Graphviz table, which the ``dot`` program the renderer already uses turns
into svg or png (no plotting library). Standard library only.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hooktrace.check.findings import NOTE, Finding
from hooktrace.log.words import ROOT, plural
from hooktrace.show.calls import depth_of
from hooktrace.show.output import MARK
from hooktrace.show.render.dot import norm_text
from hooktrace.show.steplog import ModuleKey
from hooktrace.show.view.data import Cell, RunData

VALUES = ("grad_output", "params")
# viridis at 5 stops: dark = small gradient, yellow = large
PALETTE = ((0x44, 0x01, 0x54), (0x3b, 0x52, 0x8b), (0x21, 0x91, 0x8c), (0x5e, 0xc9, 0x62),
           (0xfd, 0xe7, 0x25))
NONFINITE = "#d62728"
NO_GRAD = "#c8c8c8"
EMPTY = "#ffffff"
MARKS = {  # mark -> (fill, text, what the legend says)
    "nonfinite": (NONFINITE, "NaN", "NaN/Inf (output or gradient)"),
    "no-grad": (NO_GRAD, "\N{EN DASH}", "ran with gradients on, got no gradient"),
    "zero": (NO_GRAD, "0", "gradient exactly 0"),
    "anomaly": ("#ffe08a", "!", "watched step: an anomaly record"),
}


@dataclass(slots=True)
class HeatCell:
    fill: str
    text: str = ""  # a mark drawn in the cell
    tip: str = ""  # the numbers, for hover
    finding: bool = False
    log10: float | None = None


@dataclass(slots=True)
class Heatmap:
    values: str  # grad_output or params
    rows: list[ModuleKey]
    labels: list[str]
    depths: list[int]
    steps: list[int]
    watched: set[int]  # steps without events: only anomaly records
    cells: list[list[HeatCell]]
    low: float | None  # log10 range of the colour scale
    high: float | None
    title: str = ""
    flagged_rows: set[int] = field(default_factory=set)  # rows named by a finding of no step


def colour(t: float) -> str:
    """The palette at ``t`` in [0, 1], as #rrggbb."""
    t = min(max(t, 0.0), 1.0) * (len(PALETTE) - 1)
    i = min(int(t), len(PALETTE) - 2)
    a, b, f = PALETTE[i], PALETTE[i + 1], t - i
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def _value(cell: Cell, values: str) -> float | None:
    return cell.grad_norm if values == "grad_output" else cell.param_norm


def _mark(cell: Cell | None, values: str, anomalies: list[str]) -> str | None:
    if anomalies:
        return "nonfinite" if any("nonfinite" in a for a in anomalies) else "anomaly"
    if cell is None:
        return None
    value = _value(cell, values)
    if cell.output_nan or cell.output_inf or cell.grad_nan or cell.grad_inf or (
            value is not None and not math.isfinite(value)):
        return "nonfinite"
    if values == "grad_output" and cell.calls and not cell.backward:
        return "no-grad"
    if values == "params" and cell.params_seen and value is None:
        return "no-grad"
    return "zero" if value == 0 else None


def _tip(cell: Cell | None, anomalies: list[str]) -> str:
    if cell is None:
        return "; ".join(anomalies) or "not called"
    parts = [f"{plural(cell.calls, 'call')}, {cell.backward} backward"]
    if cell.no_grad:
        parts.append(f"{cell.no_grad} under no_grad")
    if cell.grad_norm is not None:
        parts.append(f"grad_output norm {cell.grad_norm:.4g}")
    if cell.param_norm is not None:
        parts.append(f"param grad norm {cell.param_norm:.4g}")
    if cell.params_seen and cell.param_norm is None:
        parts.append("no parameter gradient")
    for what, n in (("NaN in outputs", cell.output_nan), ("Inf in outputs", cell.output_inf),
                    ("NaN in gradients", cell.grad_nan), ("Inf in gradients", cell.grad_inf)):
        if n:
            parts.append(f"{n} {what}")
    return "; ".join([*parts, *anomalies])


def _range(data: RunData, values: str) -> tuple[float | None, float | None]:
    logs = [math.log10(v) for c in data.cells.values()
            if (v := _value(c, values)) is not None and math.isfinite(v) and v > 0]
    return (min(logs), max(logs)) if logs else (None, None)


def heatmap(data: RunData, findings: Sequence[Finding] = (), values: str = "grad_output"
            ) -> Heatmap:
    """``data``'s heatmap of ``values``, with ``findings`` (of this rank) marked on their cells."""
    rows, steps = data.rows(), data.columns()
    low, high = _range(data, values)
    names = {name: index for index, name in data.models.items()}
    several = len(data.models) > 1
    anomalies: dict[tuple[int, str, int], list[str]] = {}
    for a in data.anomalies:
        anomalies.setdefault((a.model, a.fqn, a.step), []).append(f"anomaly {a.kind}")
    # problems only: a note names what is fine
    flagged = {(names.get(f.model, -1), f.module, f.step) for f in findings
               if f.severity != NOTE}
    heat = Heatmap(values, rows, [], [depth_of(fqn) for _, fqn in rows], steps,
                   set(steps) - data.steps, [], low, high)
    for i, (model, fqn) in enumerate(rows):
        name = fqn.rpartition(".")[2] if fqn else (data.models.get(model, str(model))
                                                    if several else ROOT)
        heat.labels.append(f"{name} ({data.classes.get((model, fqn), '?')})")
        if (model, fqn, None) in flagged:
            heat.flagged_rows.add(i)
        heat.cells.append([_cell(data, (model, fqn, s), values, anomalies.get((model, fqn, s), []),
                                 (model, fqn, s) in flagged, low, high) for s in steps])
    return heat


def _cell(data: RunData, key: tuple[int, str, int], values: str, anomalies: list[str],
          finding: bool, low: float | None, high: float | None) -> HeatCell:
    cell = data.cells.get(key)
    mark = _mark(cell, values, anomalies)
    tip = _tip(cell, anomalies)
    if mark is not None:
        fill, text, _ = MARKS[mark]
        if mark == "nonfinite" and cell is not None and (cell.grad_inf or cell.output_inf) \
                and not (cell.grad_nan or cell.output_nan):
            text = "Inf"
        return HeatCell(fill, text, tip, finding)
    value = _value(cell, values) if cell is not None else None
    if value is None or low is None or high is None:
        return HeatCell(EMPTY, "", tip, finding)
    exponent = math.log10(value)
    span = high - low
    return HeatCell(colour((exponent - low) / span if span > 0 else 0.5), "", tip, finding,
                    exponent)


_e = html.escape  # quotes too: the text goes into attributes


def legend_items(heat: Heatmap) -> list[tuple[str, str, str]]:
    """(fill, mark, text) for the legend: the colour scale's ends and the marks."""
    items = []
    if heat.low is not None and heat.high is not None:
        items += [(colour(0), "", f"|g| {norm_text(10 ** heat.low)} (smallest)"),
                  (colour(0.5), "", f"|g| {norm_text(10 ** ((heat.low + heat.high) / 2))}"),
                  (colour(1), "", f"|g| {norm_text(10 ** heat.high)} (largest)")]
    items += [(fill, text, what) for fill, text, what in MARKS.values()]
    items.append((EMPTY, "", "not called (or no statistics)"))
    return items


def _text_colour(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 140 else "#202020"


def to_html(heat: Heatmap, rank: int) -> str:
    """The heatmap as an HTML table; cells carry their numbers in ``data-tip`` and an id
    ``h{rank}-{row}-{step}`` that findings link to."""
    head = "".join(f'<th class="{"watched" if s in heat.watched else ""}">{s}</th>'
                   for s in heat.steps)
    lines = [f'<table class="heat" data-values="{heat.values}"><thead><tr><th></th>{head}'
             "</tr></thead><tbody>"]
    for i, (label, depth) in enumerate(zip(heat.labels, heat.depths, strict=True)):
        flag = ' class="flagged"' if i in heat.flagged_rows else ""
        cells = []
        for step, c in zip(heat.steps, heat.cells[i], strict=True):
            cls = ' class="finding"' if c.finding else ""
            cells.append(f'<td id="h{rank}-{heat.values}-{i}-{step}"{cls} style="background:'
                         f'{c.fill};color:{_text_colour(c.fill)}" data-tip="{_e(c.tip)}">'
                         f"{_e(c.text)}</td>")
        lines.append(f'<tr data-row="{i}"><th{flag} style="padding-left:{0.3 + depth * 0.8}em">'
                     f'{_e(label)}</th>{"".join(cells)}</tr>')
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _dot_cell(c: HeatCell, width: int) -> str:
    border = ' BORDER="2" COLOR="#000000"' if c.finding else ""
    text = f'<FONT COLOR="{_text_colour(c.fill)}">{_e(c.text)}</FONT>' if c.text else " "
    return (f'<TD BGCOLOR="{c.fill}" WIDTH="{width}" HEIGHT="14" FIXEDSIZE="TRUE"{border}>'
            f"{text}</TD>")


def heatmap_dot(heat: Heatmap) -> str:
    """The heatmap as DOT: one table, laid out by ``dot`` into svg or png."""
    width = 22 if len(heat.steps) < 40 else 10
    what = "grad_output norm" if heat.values == "grad_output" else "parameter-gradient norm"
    rows = [f'<TR><TD ALIGN="LEFT" COLSPAN="{len(heat.steps) + 1}"><B>{_e(heat.title)}</B> · '
            f"log10 {what}, modules in forward order &#215; steps</TD></TR>",
            '<TR><TD ALIGN="RIGHT">step</TD>' + "".join(
                f'<TD><FONT POINT-SIZE="7">{s}{"w" if s in heat.watched else ""}</FONT></TD>'
                for s in heat.steps) + "</TR>"]
    for i, (label, depth) in enumerate(zip(heat.labels, heat.depths, strict=True)):
        name = "&#160;" * (2 * depth) + _e(label)
        if i in heat.flagged_rows:
            name = f"<B>! {name}</B>"
        rows.append(f'<TR><TD ALIGN="LEFT">{name}</TD>'
                    + "".join(_dot_cell(c, width) for c in heat.cells[i]) + "</TR>")
    legend = "".join(
        f'<TR><TD BGCOLOR="{fill}" WIDTH="22" HEIGHT="14" FIXEDSIZE="TRUE">'
        f'<FONT COLOR="{_text_colour(fill)}">{_e(text) or " "}</FONT></TD>'
        f'<TD ALIGN="LEFT">{_e(what)}</TD></TR>' for fill, text, what in legend_items(heat))
    legend += ('<TR><TD BORDER="2" COLOR="#000000" WIDTH="22" HEIGHT="14" FIXEDSIZE="TRUE"> '
               '</TD><TD ALIGN="LEFT">named by a finding of check</TD></TR>')
    table = ('<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="1" CELLPADDING="1">'
             + "".join(rows) + "</TABLE>")
    legend_table = ('<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="1">'
                    + legend + "</TABLE>")
    return ("digraph heatmap {\n\tgraph [rankdir=LR fontname=Helvetica "
            f'comment="{MARK}"]\n'
            "\tnode [shape=plaintext fontname=Helvetica fontsize=9]\n"
            f"\theat [label=<{table}>]\n\tlegend [label=<{legend_table}>]\n"
            "\theat -> legend [style=invis]\n}\n")

"""The view page itself: one self-contained HTML file (styles, script and data inline; no
network, no server) from the pieces ``hooktrace.show.view`` gathers."""

from __future__ import annotations

import html
from typing import Any

import orjson

from hooktrace.log.words import ROOT

#: The call graph's pane in a 1400x1000 browser window (CSS px), and the least scale a drawing
#: is shown at (its 10-point labels at 5 px): below it the pane scrolls, and a step's first
#: drawing that would need less is drawn a level shallower (``graphs._graph``)
PANE = (520, 680)
LEAST_SCALE = 0.4

CSS = """
body{font:13px/1.4 Helvetica,Arial,sans-serif;margin:0;color:#202020;background:#fafafa}
header{padding:8px 14px;background:#20303f;color:#fff}
header h1{font-size:16px;margin:0 0 2px}
header .meta{font-size:12px;color:#c8d3de}
#controls{padding:8px 14px;background:#eef1f4;border-bottom:1px solid #d0d6dc;position:sticky;
top:0;z-index:5;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
#controls label{font-weight:bold}
main{display:grid;grid-template-columns:minmax(0,2fr) minmax(360px,3fr);gap:12px;padding:12px}
#side{display:flex;flex-direction:column;gap:12px;min-width:0}
section{background:#fff;border:1px solid #d8dde2;border-radius:6px;padding:8px 10px;min-width:0}
section h2{font-size:14px;margin:0 0 6px}
section h2 .muted{font-weight:normal;font-size:12px}
#graph{overflow:auto;max-height:88vh}
#graph svg{display:block}
#graph svg g.node{cursor:pointer}
#graph svg g.node.hit polygon,#graph svg g.node.hit path{stroke:#e4007c;stroke-width:3}
#graph svg g.node.unfoldable{cursor:zoom-in}
#graph svg g.node.unfolded polygon,#graph svg g.node.unfolded path{stroke:#0a6ebd;stroke-width:3}
#fold{margin-left:8px;font-size:12px}
#heatwrap{overflow:auto;max-height:70vh}
#findings{max-height:22vh;overflow:auto;padding-left:18px;margin:0}
table.heat{border-collapse:separate;border-spacing:1px;font-size:11px}
table.heat th{font-weight:normal;text-align:left;white-space:nowrap;position:sticky;left:0;
background:#fff}
table.heat thead th{position:sticky;top:0;text-align:center;z-index:2}
table.heat th.flagged{color:#b00;font-weight:bold}
table.heat th.watched{color:#9a6b00}
table.heat td{min-width:20px;height:14px;text-align:center;font-size:9px;cursor:pointer}
table.heat td.finding{outline:2px solid #000;outline-offset:-2px}
table.heat td.flash,table.heat th.flash{outline:3px solid #e4007c}
.findings li{margin:0 0 8px;cursor:pointer}
.findings li:hover{background:#f2f5f8}
.sev-error{color:#b00;font-weight:bold}.sev-warning{color:#a65e00;font-weight:bold}
.sev-note{color:#555}
.legend span{display:inline-block;width:18px;height:12px;vertical-align:middle;margin:0 3px 0 10px;
border:1px solid #aaa;text-align:center;font-size:9px;line-height:12px}
#tip{position:fixed;display:none;max-width:460px;background:#fffef5;border:1px solid #888;
padding:6px 8px;font-size:12px;box-shadow:2px 2px 6px rgba(0,0,0,.25);z-index:10;
pointer-events:none;white-space:normal}
#tip b{display:block;font-size:13px;margin-bottom:2px}
#tip table{border-collapse:collapse}#tip td{vertical-align:top;padding:0 6px 0 0}
.muted{color:#666}
.hint{color:#2d5a27}
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const tip = $("tip");
const MIN_SCALE = __LEAST_SCALE__;
let rank = DATA.start, values = "grad_output";
function esc(s) {
  const d = document.createElement("div"); d.textContent = String(s); return d.innerHTML;
}
function run() { return DATA.ranks[rank]; }
function showTip(ev, title, rows) {
  let h = "<b>" + esc(title) + "</b><table>";
  for (const [k, v] of rows) h += "<tr><td class='muted'>" + esc(k) + "</td><td>" +
    (Array.isArray(v) ? v.map(esc).join("<br>") : esc(v)) + "</td></tr>";
  tip.innerHTML = h + "</table>"; tip.style.display = "block"; moveTip(ev);
}
function moveTip(ev) {
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
  tip.style.left = Math.max(0, x) + "px"; tip.style.top = Math.max(0, y) + "px";
}
function hideTip() { tip.style.display = "none"; }
function fillSelect(sel, items, chosen) {
  sel.innerHTML = "";
  for (const [value, text] of items) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; sel.appendChild(o);
  }
  if (chosen !== undefined && items.some(([v]) => String(v) === String(chosen))) sel.value = chosen;
}
function steps() {
  const model = $("model").value;
  return Object.keys(run().graphs).filter(k => k.split("|")[0] === model)
    .map(k => Number(k.split("|")[1])).sort((a, b) => a - b);
}
function setupRank() {
  const r = run();
  fillSelect($("model"), [["", "all models"], ...r.models.map(m => [m, m])], $("model").value);
  $("model").disabled = r.models.length < 2;
  setupSteps($("step").value);
  $("heatwrap").innerHTML = r.heat[values];
  $("anomalies").innerHTML = r.anomalies;
  bindHeat();
}
function setupSteps(chosen) {
  const s = steps();
  fillSelect($("step"), s.map(n => [n, "step " + n]), chosen);
  $("slider").min = 0; $("slider").max = Math.max(0, s.length - 1);
  draw();
}
function graphKey() { return $("model").value + "|" + $("step").value; }
function draw() {
  const g = run().graphs[graphKey()];
  $("slider").value = Math.max(0, steps().indexOf(Number($("step").value)));
  $("fold").hidden = true;
  if (!g) { $("graph").innerHTML = "<p class='muted'>no events in this step</p>"; return; }
  show(g, "");
}
function show(g, unfolded) {
  $("graph").innerHTML = g.svg || "<p class='muted'>No call graph: " + esc(DATA.nodot) + "</p>";
  if (!unfolded) fit();  // an unfolded block is shown at its own size, scrolled to
  $("graph").dataset.step = $("step").value;
  $("graph").dataset.unfolded = unfolded;
  $("graph-summary").textContent = "step " + $("step").value + ": " + g.summary +
    (unfolded ? " · unfolded " + unfolded : "");
  for (const node of $("graph").querySelectorAll("g.node")) {
    const t = node.querySelector("title"); if (!t) continue;
    const d = g.nodes[t.textContent]; t.remove();
    if (!d) continue;
    node.dataset.fqn = d.fqn; node.dataset.model = d.model;
    node.addEventListener("mousemove", (ev) => showTip(ev, (d.fqn || __ROOT__) + " · " + d["class"],
      Object.entries(d).filter(([k]) => !["fqn", "class", "model"].includes(k))));
    node.addEventListener("mouseleave", hideTip);
    if (d.folded && g.unfold) {
      node.classList.add("unfoldable");
      node.addEventListener("click", () => unfold(g, d));
    }
  }
}
function fit() {
  // The whole step at first sight: the drawing scaled down (never up) to the pane's width and
  // to the window's height below the pane's top, to MIN_SCALE at most (then it scrolls).
  const box = $("graph"), svg = box.querySelector("svg");
  if (!svg) return;
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  const top = box.getBoundingClientRect().top + window.scrollY;
  const room = Math.max(240, window.innerHeight - top - 28);
  const scale = Math.max(MIN_SCALE, Math.min(1, (box.clientWidth - 4) / w, room / h));
  svg.setAttribute("width", (w * scale).toFixed(1) + "px");
  svg.setAttribute("height", (h * scale).toFixed(1) + "px");
  box.style.maxHeight = room + "px";
}
async function unpack(text) {  // base64 of gzipped JSON, as hooktrace.show.view.graphs packs it
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}
async function unfold(g, d) {
  // The step drawn one level deeper, the clicked block's nodes outlined; "fold" goes back.
  const key = graphKey();
  hideTip();
  g.deeper = g.deeper || await unpack(g.unfold);
  if (graphKey() !== key) return;  // another step was chosen meanwhile
  show(g.deeper, d.fqn || __ROOT__);
  const prefix = d.fqn ? d.fqn + "." : "";
  const inside = [...$("graph").querySelectorAll("g.node")].filter((n) =>
    n.dataset.model === d.model && n.dataset.fqn !== undefined &&
    (n.dataset.fqn === d.fqn || n.dataset.fqn.startsWith(prefix)));
  for (const n of inside) n.classList.add("unfolded");
  if (inside.length) {  // into the middle of the graph's box; the page itself stays put
    const box = $("graph"), at = inside[0].getBoundingClientRect();
    const top = box.getBoundingClientRect();
    box.scrollTop += at.top - top.top - box.clientHeight / 3;
    box.scrollLeft += at.left - top.left - box.clientWidth / 3;
  }
  $("fold").textContent = "fold " + (d.fqn || __ROOT__) + " again";
  $("fold").hidden = false;
}
function bindHeat() {
  for (const td of $("heatwrap").querySelectorAll("td")) {
    td.addEventListener("mousemove", (ev) => {
      const row = td.parentElement.querySelector("th").textContent.trim();
      const step = td.id.split("-").pop();
      showTip(ev, row + " · step " + step, [["", td.dataset.tip]]);
    });
    td.addEventListener("mouseleave", hideTip);
    td.addEventListener("click", () => {
      const s = td.id.split("-").pop();
      if (steps().includes(Number(s))) { $("step").value = s; draw(); }
    });
  }
}
function highlight(model, module) {
  for (const n of $("graph").querySelectorAll("g.node")) {
    const f = n.dataset.fqn;
    const hit = n.dataset.model === model &&
      (f === module || (f !== undefined && module.startsWith(f ? f + "." : "")));
    n.classList.toggle("hit", hit);
  }
}
function goFinding(f) {
  if (f.step !== null && steps().includes(f.step)) { $("step").value = String(f.step); draw(); }
  highlight(f.model, f.module);
  const cells = $("heatwrap").querySelectorAll("td.finding");
  for (const c of cells) c.classList.remove("flash");
  const row = f.rows[String(rank)];
  if (row === undefined) return;
  const prefix = "h" + run().rank + "-" + values + "-" + row + "-";
  const cell = document.getElementById(prefix + (f.step ?? "")) ||
    $("heatwrap").querySelector("tr[data-row='" + row + "'] th");
  if (cell) {
    cell.classList.add("flash"); cell.scrollIntoView({block: "nearest", inline: "nearest"});
  }
}
function setupFindings() {
  const ul = $("findings");
  DATA.findings.forEach((f, i) => {
    const li = document.createElement("li");
    li.innerHTML = "<span class='sev-" + f.severity + "'>[" + esc(f.cause) + "]</span> " +
      esc(f.where) + (f.ranks ? " · rank " + f.ranks.join(", ") : "") +
      "<br><span class='muted'>" + esc(f.message) + "</span>" +
      (f.hint ? "<br><span class='hint'>hint: " + esc(f.hint) + "</span>" : "");
    li.addEventListener("click", () => goFinding(f));
    li.id = "finding-" + i; ul.appendChild(li);
  });
  if (!DATA.findings.length) ul.innerHTML = "<li class='muted'>No findings.</li>";
}
fillSelect($("rank"), DATA.ranks.map((r, i) => [i, "rank " + r.rank]), rank);
$("rank").disabled = DATA.ranks.length < 2;
$("rank").addEventListener("change", () => { rank = Number($("rank").value); setupRank(); });
$("model").addEventListener("change", () => setupSteps($("step").value));
$("step").addEventListener("change", draw);
$("fold").addEventListener("click", draw);
$("slider").addEventListener("input", () => {
  $("step").value = String(steps()[Number($("slider").value)]); draw();
});
for (const r of document.querySelectorAll("input[name=values]")) {
  r.addEventListener("change", () => {
    values = r.value; $("heatwrap").innerHTML = run().heat[values]; bindHeat();
  });
}
setupRank();
setupFindings();
""".replace("__ROOT__", orjson.dumps(ROOT).decode()).replace(  # the root as outputs name it
    "__LEAST_SCALE__", str(LEAST_SCALE))


def page(title: str, meta: str, data: dict[str, Any], legend: str) -> str:
    """The whole page; ``data`` is embedded as JSON (``</`` escaped so that no string in it
    can end the script element)."""
    blob = orjson.dumps(data).decode("utf-8").replace("</", "<\\/")
    e = html.escape
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>{CSS}</style></head>
<body>
<header><h1>hooktrace view · {e(title)}</h1><div class="meta">{e(meta)}</div></header>
<div id="controls">
<span><label for="rank">rank</label> <select id="rank"></select></span>
<span><label for="model">model</label> <select id="model"></select></span>
<span><label for="step">step</label> <select id="step"></select>
<input type="range" id="slider" min="0" max="0" value="0" aria-label="step"></span>
<span class="muted" id="graph-summary"></span>
</div>
<main>
<section><h2>Call graph <span class="muted">(click a block with "+N calls inside" to
unfold it)</span><button id="fold" hidden></button></h2><div id="graph"></div></section>
<div id="side">
<section><h2>Findings (hooktrace check)</h2><ul class="findings" id="findings"></ul></section>
<section id="heatmap-section"><h2>Gradient flow: log10 of the gradient norm, modules in forward
order &times; steps</h2>
<div><label><input type="radio" name="values" value="grad_output" checked> grad_output
norm</label> <label><input type="radio" name="values" value="params"> parameter-gradient
norm</label></div>
<div class="legend">{legend}</div>
<div id="heatwrap"></div>
<div id="anomalies"></div>
</section>
</div>
</main>
<div id="tip"></div>
<script type="application/json" id="data">{blob}</script>
<script>{SCRIPT}</script>
</body></html>
"""

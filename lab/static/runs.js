// Runs tab: a run's train/val loss against step, or every run of a sweep (val loss, one colour a cell: its seeds
// thin lines of that colour, one legend entry a cell), drawn in SVG; for a sweep
// also the ablation table from analysis/report.py and the runs that did not complete; for a run its head
// importance over training, where `scripts/head_importance.py RUN --over-training` has written it.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f5bd3", "#d92d20", "#079455", "#dc6803", "#7a5af8", "#0e9384", "#c11574", "#667085",
  "#854a0e", "#b2a100", "#e478b8", "#1b1b1b"];

// A sweep's cell i: the palette's twelve, then hues a golden angle apart (no two cells alike however many).
function cellColour(i) {
  return i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i * 137.508) % 360)}, 70%, ${i % 2 ? 38 : 52}%)`;
}

// The sweep's val-loss series, one a run, coloured by cell (its seeds share it, thin), and one legend entry a cell.
function sweepSeries(view) {
  const drawn = view.runs.filter((r) => r.curves["val/loss"] && r.cell !== null);
  const series = drawn.map((r) => ({ name: r.name, points: r.curves["val/loss"], colour: cellColour(r.cell),
    thin: true, cell: r.cell }));
  const legend = view.cells.map((label, i) => {
    const seeds = drawn.filter((r) => r.cell === i).length;
    // shown as the keys' last parts (d_k=8, n_head=2), whole in its tooltip
    return { name: label.replace(/[\w.]*\.(\w+)=/g, "$1="), title: `${label} (${seeds} seed${seeds === 1 ? "" : "s"})`,
      colour: cellColour(i), cell: i };
  }).filter((entry) => drawn.some((r) => r.cell === entry.cell));
  return { series, legend };
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Round tick values (1, 2, 5 x 10^n) covering [lo, hi].
function ticks(lo, hi, count) {
  const span = hi - lo || 1, raw = span / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => span / s <= count) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

// series: [{name, points: [[step, value], ...], colour, dashed, thin}]; legend: [{name, colour, dashed, cell}]
function lineChart(series, yLabel, legend = series) {
  const W = 900, H = 360, m = { l: 56, r: 230, t: 14, b: 40 }, all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), pad = (Math.max(...ys) - Math.min(...ys)) * 0.05 || 0.1;
  const y0 = Math.min(...ys) - pad, y1 = Math.max(...ys) + pad;
  const X = (v) => m.l + ((v - x0) / (x1 - x0 || 1)) * (W - m.l - m.r);
  const Y = (v) => H - m.b - ((v - y0) / (y1 - y0)) * (H - m.t - m.b);
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": yLabel });
  for (const v of ticks(y0, y1, 8)) {
    root.append(svg("line", { class: "grid", x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }));
    root.append(svg("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end" }, v.toFixed(2)));
  }
  for (const v of ticks(x0, x1, 8)) root.append(svg("text", { x: X(v), y: H - m.b + 16, "text-anchor": "middle" }, String(v)));
  root.append(svg("line", { class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  root.append(svg("line", { class: "axis", x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
  root.append(svg("text", { x: (m.l + W - m.r) / 2, y: H - 6, "text-anchor": "middle" }, "step"));
  root.append(svg("text", { x: 14, y: (m.t + H - m.b) / 2, transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})`,
    "text-anchor": "middle" }, yLabel));
  series.forEach((s, i) => {
    const d = s.points.map(([x, y], j) => `${j ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join("");
    root.append(svg("path", { d, fill: "none", stroke: s.colour, "stroke-width": s.dashed || s.thin ? 1.2 : 2,
      "stroke-dasharray": s.dashed ? "4 3" : "none", "data-series": s.name, ...(s.thin ? { "data-cell": s.cell } : {}) }));
    if (s.points.length === 1) {  // a path of one point draws nothing (a run stopped after its first evaluation)
      const [x, y] = s.points[0];
      root.append(svg("circle", { cx: X(x), cy: Y(y), r: 3.5, fill: s.colour, "data-series": s.name,
        ...(s.thin ? { "data-cell": s.cell } : {}) }));
    }
  });
  legend.forEach((s, i) => {
    const ly = m.t + 8 + i * 18, entry = svg("g", { class: "legend", ...(s.cell !== undefined ? { "data-cell": s.cell } : {}) });
    entry.append(svg("line", { x1: W - m.r + 14, x2: W - m.r + 34, y1: ly, y2: ly, stroke: s.colour, "stroke-width": 2,
      "stroke-dasharray": s.dashed ? "4 3" : "none" }));
    // a long cell label is cut to the legend's column; its whole text is the entry's tooltip
    const text = svg("text", { x: W - m.r + 40, y: ly + 4 }, s.name.length > 30 ? `${s.name.slice(0, 29)}…` : s.name);
    text.append(svg("title", {}, s.title || s.name));
    entry.append(text);
    root.append(entry);
  });
  return root;
}

function dataTable(table, caption) {
  const node = el("table", { class: "data" });
  if (caption) node.append(el("caption", { class: "hint", text: caption }));
  node.append(el("tr", {}, ...table.header.map((h) => el("th", { text: h }))));
  for (const row of table.rows) node.append(el("tr", {}, ...row.map((c) => el("td", { text: c }))));
  return node;
}

// One measure at every step checkpoint: heads as rows, steps as columns, each cell shaded by its value
// between the table's smallest (light) and largest (dark).
function importanceTable(result, key) {
  const grids = result[key], values = grids.flat(2), lo = Math.min(...values), hi = Math.max(...values);
  const node = el("table", { class: "data", "data-measure": key });
  node.append(el("caption", { class: "hint", text: result.measures[key] }));
  node.append(el("tr", {}, el("th", { text: "head \\ step" }), ...result.steps.map((s) => el("th", { text: String(s) }))));
  for (let i = 0; i < result.shape.n_layer; i++) {
    for (let j = 0; j < result.shape.n_head; j++) {
      const cells = grids.map((grid, s) => {
        const value = grid[i][j], share = hi > lo ? (value - lo) / (hi - lo) : 0;
        const cell = el("td", { text: value.toFixed(4), title: `layer ${i} head ${j}, step ${result.steps[s]}` });
        cell.style.background = `rgba(47, 91, 211, ${(0.06 + 0.74 * share).toFixed(3)})`;
        if (share > 0.55) cell.style.color = "#fff";
        return cell;
      });
      node.append(el("tr", {}, el("th", { text: `layer ${i} head ${j}` }), ...cells));
    }
  }
  return node;
}

let shownRun = 0;  // the newest Open: an older request's answer, arriving late, is dropped

async function renderHeadImportance(path, into) {
  const asked = ++shownRun, section = el("div", { id: "runs-importance" });
  section.append(el("h3", { class: "sub", text: "Head importance over training (Michel et al. 2019)" }));
  let result;
  try { result = await api("/api/runs/head_importance", { path }); } catch (e) { result = { missing: e.message }; }
  if (asked !== shownRun) return;
  if (result.missing) section.append(el("p", { class: "hint", text: result.missing }));
  else {
    section.append(el("p", { class: "hint", text: `${result.steps.length} step checkpoints, each measured on the `
      + `same ${result.tokens} tokens of the ${result.data}.` }));
    for (const key of Object.keys(result.measures)) section.append(importanceTable(result, key));
  }
  into.append(section);
}

function clearRuns() {
  $("runs-chart").innerHTML = ""; $("runs-tables").innerHTML = "";
  shownRun++;  // a head-importance answer still on its way belongs to the view cleared here
}

function renderRuns(view) {
  const chart = $("runs-chart"), tables = $("runs-tables");
  clearRuns();
  let series, legend;
  if (view.kind === "run") {
    const c = view.runs[0].curves;
    series = [["val/loss", false, PALETTE[0]], ["train/loss", true, PALETTE[1]]]
      .filter(([k]) => c[k]).map(([k, dashed, colour]) => ({ name: k, points: c[k], colour, dashed }));
  } else {
    ({ series, legend } = sweepSeries(view));
  }
  const yLabel = view.kind === "run" ? "loss (nats/token)" : "val/loss (nats/token)";
  if (series.length) chart.append(lineChart(series, yLabel, legend));
  else chart.append(el("p", { class: "hint", text: "no loss logged yet in metrics.jsonl" }));
  if (view.kind === "sweep") {
    if (view.table.header.length) {  // none where the report refuses these runs as one table: the note says why
      tables.append(el("h3", { class: "sub", text: "Ablation table (analysis/report.py)" }), dataTable(view.table));
    }
    tables.append(el("p", { class: "hint", text: view.note }));
    if (view.unfinished.rows.length) tables.append(dataTable(view.unfinished));
  }
  $("runs-status").textContent = `${view.kind === "run" ? "run" : `sweep of ${view.runs.length} runs`}: ${view.path}`;
  if (view.kind === "run") renderHeadImportance(view.path, tables);
}

document.addEventListener("DOMContentLoaded", () => {
  $("runs-form").addEventListener("submit", (event) => {
    event.preventDefault();
    // cleared first: on an error the last view's chart stayed under the status line naming the new path
    guarded(event.submitter, $("runs-status"), async () => {
      clearRuns();
      renderRuns(await api("/api/runs", { path: $("runs-path").value }));
    });
  });
});

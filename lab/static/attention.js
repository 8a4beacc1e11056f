// Attention tab: one layer's weights (n_head, T, T) drawn as heatmaps on canvas, one head or all heads as small
// multiples, plus a strip per head colouring every key token by how much the chosen query attends to it.
// A variant's readings come with the weights: a sliding window's band (keys before it hatched like the
// future), the sink's share of each row, and the gates (gated attention, value embeddings), one line per head.
"use strict";

const attn = { data: null, prompt: null, query: null, pinned: null };
// ColorBrewer's YlGnBu (pale = little attention, navy = much): sequential, so weak weights fade into the
// page and a strip of tokens stays readable; the masked future is grey hatching, unlike any weight.
const YLGNBU = ["#ffffd9", "#edf8b1", "#c7e9b4", "#7fcdbb", "#41b6c4", "#1d91c0", "#225ea8", "#253494", "#081d58"]
  .map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));

function colour(t) {
  const x = Math.min(1, Math.max(0, t)) * (YLGNBU.length - 1), i = Math.min(Math.floor(x), YLGNBU.length - 2);
  const f = x - i, a = YLGNBU[i], b = YLGNBU[i + 1];
  return [0, 1, 2].map((c) => Math.round(a[c] + f * (b[c] - a[c])));
}

function decodeWeights(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}

// Six decimals; a weight under 1e-4 (which the log scale is for) in scientific notation, not as 0.000000.
function fmtWeight(w) { return w >= 1e-4 || w === 0 ? w.toFixed(6) : w.toExponential(2); }

function weight(h, q, k) { const T = attn.data.shape[1]; return attn.data.weights[(h * T + q) * T + k]; }

// Whether query q sees key k: an earlier key (or itself), and with a sliding window one of its last `window`.
function visible(q, k) { const W = attn.data.window; return k <= q && (W === null || k > q - W); }

function shownHeads() {
  const head = $("attn-head").value, H = attn.data.shape[0];
  return head === "all" ? [...Array(H).keys()] : [Number(head)];
}

// The colour scale over what is shown: linear 0..max, or log from max/1e5 (or the smallest weight) to max;
// weights above max (query 0's) take the top colour.
function scale(heads) {
  const T = attn.data.shape[1];
  let max = 0, minPositive = Infinity;
  // Query 0 can only attend to itself (weight 1): leave it out of the range, or it would flatten every map.
  for (const h of heads) for (let q = T > 1 ? 1 : 0; q < T; q++) for (let k = 0; k <= q; k++) {
    if (!visible(q, k)) continue;
    const w = weight(h, q, k);
    max = Math.max(max, w);
    if (w > 0) minPositive = Math.min(minPositive, w);
  }
  const log = document.querySelector("input[name=attn-scale]:checked").value === "log";
  const lo = log ? Math.max(minPositive, max * 1e-5) : 0;
  const at = log ? (w) => (Math.log(Math.max(w, lo)) - Math.log(lo)) / (Math.log(max) - Math.log(lo) || 1)
    : (w) => w / (max || 1);
  return { log, lo, max, at };
}

function hatch(ctx) {
  const tile = document.createElement("canvas");
  tile.width = tile.height = 6;
  const t = tile.getContext("2d");
  t.fillStyle = "#f0f2f5"; t.fillRect(0, 0, 6, 6);
  t.strokeStyle = "#cdd2da"; t.beginPath(); t.moveTo(0, 6); t.lineTo(6, 0); t.stroke();
  return ctx.createPattern(tile, "repeat");
}

// One head's map: T x T pixels coloured, scaled up without smoothing, future (upper triangle) hatched.
function drawMap(canvas, h, sc, cell, margin) {
  const T = attn.data.shape[1], size = margin + T * cell, ratio = window.devicePixelRatio || 1;
  canvas.width = size * ratio; canvas.height = size * ratio;
  canvas.style.width = canvas.style.height = `${size}px`;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const pixels = new ImageData(T, T);
  for (let q = 0; q < T; q++) for (let k = 0; k <= q; k++) {
    if (!visible(q, k)) continue;
    const [r, g, b] = colour(sc.at(weight(h, q, k))), o = 4 * (q * T + k);
    pixels.data.set([r, g, b, 255], o);
  }
  const small = document.createElement("canvas");
  small.width = small.height = T;
  small.getContext("2d").putImageData(pixels, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(small, margin, margin, T * cell, T * cell);
  ctx.fillStyle = hatch(ctx);
  ctx.beginPath(); ctx.moveTo(margin + cell, margin);
  for (let q = 0; q < T; q++) { ctx.lineTo(margin + (q + 1) * cell, margin + q * cell); ctx.lineTo(margin + (q + 1) * cell, margin + (q + 1) * cell); }
  ctx.lineTo(margin + T * cell, margin); ctx.closePath(); ctx.fill();
  const W = attn.data.window;  // the band: keys before a query's window are masked too
  if (W !== null) for (let q = W; q < T; q++) ctx.fillRect(margin, margin + q * cell, (q - W + 1) * cell, cell);
  if (margin) drawLabels(ctx, cell, margin);
}

function drawLabels(ctx, cell, margin) {
  const labels = attn.data.labels;
  ctx.font = `${Math.min(12, cell - 2)}px ui-monospace, "DejaVu Sans Mono", monospace`;
  ctx.fillStyle = "#475467"; ctx.textBaseline = "middle";
  labels.forEach((label, i) => {
    const mid = margin + (i + 0.5) * cell, text = label.length > 8 ? label.slice(0, 7) + "…" : label;
    ctx.textAlign = "right"; ctx.fillText(text, margin - 4, mid);
    ctx.save(); ctx.translate(mid, margin - 4); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
    ctx.fillText(text, 0, 0); ctx.restore();
  });
}

function cellAt(event, cell, margin) {
  const box = event.target.getBoundingClientRect(), T = attn.data.shape[1];
  const k = Math.floor((event.clientX - box.left - margin) / cell), q = Math.floor((event.clientY - box.top - margin) / cell);
  return q >= 0 && k >= 0 && q < T && k < T ? { q, k } : null;
}

function describe(h, q, k) {
  const L = attn.data.labels, head = `layer ${attn.data.layer}, head ${h}`;
  const what = k > q ? "masked (a future token)" : !visible(q, k) ? `masked (before the window of ${attn.data.window})`
    : `weight ${fmtWeight(weight(h, q, k))}`;
  const sink = attn.data.sink_share ? `\nsink ${percentOf(attn.data.sink_share[h][q])} of the row` : "";
  return `${head}\nquery ${q} “${L[q]}” → key ${k} “${L[k]}”\n${what}${sink}`;
}

function renderMaps() {
  const box = $("attn-maps"), heads = shownHeads(), sc = scale(heads), T = attn.data.shape[1];
  const multiple = heads.length > 1;
  // Fixed cell sizes: a long prompt makes the map scroll, never shrink below readable.
  // Small multiples are the overview (at least 3 px a token; click one to open it at full size).
  const cell = multiple ? Math.max(3, Math.min(12, Math.floor(240 / T))) : T <= 48 ? 20 : 14;
  const longest = Math.max(...attn.data.labels.map((l) => Math.min(l.length, 8)));
  const margin = multiple ? 0 : 14 + 7.5 * longest;
  box.innerHTML = "";
  for (const h of heads) {
    const canvas = el("canvas", { "data-head": String(h), "data-cell": String(cell), "data-margin": String(margin) });
    drawMap(canvas, h, sc, cell, margin);
    canvas.addEventListener("mousemove", (e) => {
      const at = cellAt(e, cell, margin);
      if (at) { $("attn-readout").textContent = describe(h, at.q, at.k); setQuery(at.q, false); }
    });
    canvas.addEventListener("mouseleave", () => setQuery(attn.pinned, false));
    canvas.addEventListener("click", (e) => {
      if (multiple) { $("attn-head").value = String(h); return renderAll(); }
      const at = cellAt(e, cell, margin);
      if (at) setQuery(at.q, true);
    });
    const mark = el("div", { class: "row-mark" });
    mark.dataset.cell = String(cell); mark.dataset.margin = String(margin);
    const figure = el("figure", { class: multiple ? "attn-map multiple" : "attn-map" },
      el("figcaption", { text: `layer ${attn.data.layer} · head ${h}${multiple ? " (click to open)" : ""}` }),
      el("div", { class: "map-box" }, canvas, mark));
    const line = variantLine(h);
    if (line) figure.append(line);
    box.append(figure);
  }
  renderLegend(sc);
}

function percentOf(share) { return `${(100 * share).toFixed(1)}%`; }

function mean(values) { return values.reduce((a, b) => a + b, 0) / values.length; }

// The variant's readings for head h under its map: the sink's mean share of a row's weight over the prompt's
// queries, the output gate's mean over its tokens, and the gate of the value embeddings its key/value head reads.
function variantLine(h) {
  const d = attn.data, parts = [], line = el("div", { class: "variant-line", "data-head": String(h) });
  if (d.sink_share) {
    const share = mean(d.sink_share[h]);
    line.dataset.sink = String(share);
    parts.push(`sink ${percentOf(share)}`);
  }
  if (d.gate_mean) { line.dataset.gate = String(d.gate_mean[h]); parts.push(`gate ${d.gate_mean[h].toFixed(2)}`); }
  if (d.value_gate_mean) {
    const g = Math.floor(h * d.value_gate_mean.length / d.shape[0]);  // query head h reads key/value head g
    line.dataset.valueGate = String(d.value_gate_mean[g]);
    parts.push(`value gate ${d.value_gate_mean[g].toFixed(2)} (kv head ${g})`);
  }
  if (!parts.length) return null;
  line.textContent = parts.join(" · ");
  line.title = "means over the prompt: the sink's share of a query's weight (1 − the row's sum), sigmoid(x W_gate), "
    + "the value embeddings' 2 sigmoid(x W_ve_gate)";
  return line;
}

// The chosen query's own sink share and gate, at the end of head h's strip; null for a model without them.
function queryReadings(h, q) {
  const d = attn.data, parts = [], span = el("span", { class: "query-readings" });
  if (d.sink_share) { span.dataset.sink = String(d.sink_share[h][q]); parts.push(`sink ${percentOf(d.sink_share[h][q])}`); }
  if (d.gate) { span.dataset.gate = String(d.gate[h][q]); parts.push(`gate ${d.gate[h][q].toFixed(2)}`); }
  if (!parts.length) return null;
  span.textContent = parts.join(" · ");
  return span;
}

function renderLegend(sc) {
  const bar = el("canvas", { width: "256", height: "14" }), ctx = bar.getContext("2d");
  for (let x = 0; x < 256; x++) { ctx.fillStyle = `rgb(${colour(x / 255)})`; ctx.fillRect(x, 0, 1, 14); }
  const mid = sc.log ? Math.sqrt(sc.lo * sc.max) : sc.max / 2, fmt = (v) => sc.log ? v.toExponential(1) : v.toFixed(3);
  $("attn-legend").innerHTML = "";
  $("attn-legend").append(el("div", { class: "status", text: `${sc.log ? "log" : "linear"} scale` }), bar,
    el("div", { class: "ticks" }, el("span", { text: fmt(sc.lo) }), el("span", { text: fmt(mid) }),
      el("span", { text: fmt(sc.max) })));
}

// The strips: per shown head, the prompt's tokens coloured by the query's weight on each (title = the value).
function renderStrips() {
  const heads = shownHeads(), sc = scale(heads), T = attn.data.shape[1], q = attn.query ?? T - 1;
  const box = $("attn-strips");
  box.innerHTML = "";
  for (const h of heads) {
    const strip = el("div", { class: "strip", "data-head": String(h) }, el("span", { class: "head-name", text: `h${h}` }));
    attn.data.labels.forEach((label, k) => {
      const tok = el("span", { class: "tok", "data-key": String(k), text: label });
      if (k > q) { tok.classList.add("future"); tok.title = `key ${k} “${label}”: masked (future)`; }
      else if (!visible(q, k)) {
        tok.classList.add("future", "outside"); tok.title = `key ${k} “${label}”: masked (before the window)`;
      }
      else {
        const w = weight(h, q, k), [r, g, b] = colour(sc.at(w));
        tok.style.background = `rgb(${r},${g},${b})`;
        tok.style.color = sc.at(w) > 0.55 ? "#fff" : "#1d2433";
        tok.title = `key ${k} “${label}”: ${fmtWeight(w)}`;
        tok.dataset.weight = String(w);
      }
      if (k === q) tok.classList.add("query");
      tok.addEventListener("mouseenter", () => setQuery(k, false));
      tok.addEventListener("click", () => setQuery(k, true));
      strip.append(tok);
    });
    const here = queryReadings(h, q);
    if (here) strip.append(here);
    strip.addEventListener("mouseleave", () => setQuery(attn.pinned, false));
    box.append(strip);
  }
}

// Outline the query's row (its causal part) on every map shown.
function markRows() {
  const q = attn.query ?? attn.data.shape[1] - 1;
  for (const mark of document.querySelectorAll("#attn-maps .row-mark")) {
    const cell = Number(mark.dataset.cell), margin = Number(mark.dataset.margin);
    Object.assign(mark.style, { left: `${margin - 1}px`, top: `${margin + q * cell - 1}px`,
      width: `${(q + 1) * cell + 2}px`, height: `${cell + 2}px` });
  }
}

function setQuery(q, pin) {
  if (pin) attn.pinned = q;
  const next = q ?? attn.pinned;
  if (next === attn.query) return;
  attn.query = next;
  renderStrips();
  markRows();
}

function renderAll() { renderMaps(); renderStrips(); markRows(); }

async function fetchAttention() {
  const started = performance.now(), text = prompt();  // as sent: the box may be edited meanwhile
  const data = await api("/api/attention", { prompt: text, layer: $("attn-layer").value });
  data.weights = decodeWeights(data.weights);
  const T = data.shape[1];
  attn.data = data; attn.prompt = text;
  if (attn.pinned !== null && attn.pinned >= T) attn.pinned = null;
  attn.query = attn.pinned ?? T - 1;
  const band = data.window === null ? "" : ` · window ${data.window}`;
  const cap = data.softcap === null ? "" : ` · soft-cap ${data.softcap}`;
  const seconds = ((performance.now() - started) / 1000).toFixed(2);
  $("attn-status").textContent = `${T} tokens · layer ${data.layer}${band}${cap} · ${seconds} s`;
  renderAll();
}

function fillSelect(select, n, extra) {
  select.innerHTML = "";
  for (let i = 0; i < n; i++) select.append(el("option", { value: String(i), text: String(i) }));
  if (extra) select.append(el("option", { value: extra, text: "all heads" }));
}

document.addEventListener("lab:model", (event) => {
  fillSelect($("attn-layer"), event.detail.n_layer);
  (event.detail.windows || []).forEach((W, l) => { if (W !== null) $("attn-layer").options[l].text = `${l} (window ${W})`; });
  fillSelect($("attn-head"), event.detail.n_head, "all");
  attn.data = null; attn.pinned = null; attn.prompt = null;
  $("attn-maps").innerHTML = ""; $("attn-strips").innerHTML = "";
});

document.addEventListener("DOMContentLoaded", () => {
  const run = () => guarded($("attn-run"), $("attn-status"), fetchAttention);
  $("attn-run").addEventListener("click", run);
  $("attn-layer").addEventListener("change", () => attn.data && run());
  $("attn-head").addEventListener("change", () => attn.data && renderAll());
  for (const r of document.querySelectorAll("input[name=attn-scale]")) r.addEventListener("change", () => attn.data && renderAll());
  document.querySelector("button[data-tab=attention]").addEventListener("click", () => {
    if (attn.prompt !== prompt() && lab.info) run();
  });
});

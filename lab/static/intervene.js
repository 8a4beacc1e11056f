// Intervene tab: a layer x head grid of toggles; "Compare" measures the full model and the model with the
// switched-off heads side by side (loss on the prompt, top-10 next tokens, a sample with the same seed).
"use strict";

const heads = { off: new Set(), scores: null };
const key = (layer, head) => `${layer},${head}`;

function renderHeadGrid() {
  const info = lab.info, table = el("table");
  const top = el("tr", {}, el("th"));
  for (let h = 0; h < info.n_head; h++) top.append(el("th", { text: `head ${h}` }));
  table.append(top);
  for (let l = 0; l < info.n_layer; l++) {
    const row = el("tr", {}, el("th", { text: `layer ${l}` }));
    for (let h = 0; h < info.n_head; h++) {
      const off = heads.off.has(key(l, h));
      const button = el("button", { type: "button", class: off ? "head-toggle off" : "head-toggle",
        "data-layer": String(l), "data-head": String(h), "aria-pressed": String(off), title: off ? "off (click: on)" : "on (click: off)" },
        el("span", { class: "name", text: `L${l} H${h}` }));
      if (heads.scores) {
        const d = heads.scores[l][h];
        button.append(el("span", { class: "score", text: `Δ ${d >= 0 ? "+" : ""}${d.toFixed(3)}` }));
        button.style.boxShadow = `inset 0 -4px 0 rgba(180, 35, 24, ${Math.min(1, Math.max(0, d) / heads.maxScore)})`;
      }
      button.addEventListener("click", () => {
        heads.off.has(key(l, h)) ? heads.off.delete(key(l, h)) : heads.off.add(key(l, h));
        renderHeadGrid();
      });
      row.append(el("td", {}, button));
    }
    table.append(row);
  }
  $("head-grid").innerHTML = "";
  $("head-grid").append(table);
  const list = offList();
  $("heads-off-list").textContent = list.length ? list.map(([l, h]) => `L${l} H${h}`).join(", ") : "none";
}

function offList() {
  return [...heads.off].map((k) => k.split(",").map(Number)).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
}

function renderResult(column, result, reference, text) {
  const box = document.querySelector(`#${column} .result`);
  box.innerHTML = "";
  const loss = el("div", { class: "loss", "data-loss": result.loss === null ? "" : String(result.loss) });
  loss.append(result.loss === null ? "—" : result.loss.toFixed(4), el("small", { text: " nats/token on the prompt" }));
  if (reference && result.loss !== null) {
    const d = result.loss - reference.loss;
    loss.append(el("small", { class: d > 0 ? "delta-up" : "delta-down", text: `  (${d >= 0 ? "+" : ""}${d.toFixed(4)})` }));
  }
  const bars = el("div", { class: "bars" }, el("div", { class: "status", text: "next token, top 10" }));
  for (const { token, p } of result.top) {
    const fill = el("div", { class: "fill" });
    fill.style.width = `${(100 * p).toFixed(1)}%`;
    bars.append(el("div", { class: "bar" }, el("span", { class: "tk", text: token_label(token) }),
      el("div", { class: "track" }, fill), el("span", { class: "pv", text: percent(p) })));
  }
  const sample = el("pre", { class: "output" }, el("span", { class: "prompt-text", text }),
    el("span", { class: "gen-text", text: result.sample }));
  box.append(loss, bars, sample);
}

// One decimal, or two significant digits under 1%: a wide vocabulary's top 10 may each be under 0.05%,
// which one decimal showed as ten bars of 0.0%.
function percent(p) { const v = 100 * p; return `${v >= 1 || v === 0 ? v.toFixed(1) : v.toPrecision(2)}%`; }

// The same symbols as analysis.attention.token_label, so a space or newline is visible in a bar's label.
function token_label(text) { return text.replace(/ /g, "␣").replace(/\n/g, "\\n").replace(/\t/g, "\\t") || "∅"; }

async function compare() {
  // The prompt as sent: the box may be edited while the answer is computed.
  const started = performance.now(), text = prompt();
  const data = await api("/api/intervene", { prompt: text, heads_off: offList(), ...settings() });
  renderResult("col-full", data.full, null, text);
  renderResult("col-ablated", data.ablated, data.full, text);
  $("intervene-status").textContent = `${((performance.now() - started) / 1000).toFixed(2)} s`;
}

async function scoreHeads() {
  const data = await api("/api/importance", { prompt: prompt() });
  heads.scores = data.delta;
  heads.maxScore = Math.max(1e-9, ...data.delta.flat());
  $("intervene-status").textContent = `Δ = loss with that head alone off − full loss (${data.loss.toFixed(4)})`;
  renderHeadGrid();
}

document.addEventListener("lab:model", () => { heads.off.clear(); heads.scores = null; renderHeadGrid(); });

document.addEventListener("DOMContentLoaded", () => {
  $("intervene-run").addEventListener("click", () => guarded($("intervene-run"), $("intervene-status"), compare));
  $("heads-score").addEventListener("click", () => guarded($("heads-score"), $("intervene-status"), scoreHeads));
  $("heads-all-on").addEventListener("click", () => { heads.off.clear(); renderHeadGrid(); });
});

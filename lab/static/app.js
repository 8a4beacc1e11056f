// attnlab lab: shared helpers (API calls, messages, tabs, model info) and the Sample tab.
"use strict";

const $ = (id) => document.getElementById(id);
const lab = { info: null };

// The API needs the per-launch token of the URL the lab printed (?token=...). It is kept for this tab, so a
// reload still works, and taken out of the address bar, so it is not left in the history or a screenshot.
const token = (() => {
  const url = new URL(location.href), given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem("lab-token", given);
    url.searchParams.delete("token");
    history.replaceState(history.state, "", url);
  }
  return sessionStorage.getItem("lab-token") || "";
})();

// The headers of every API call: the token, and for a body the JSON type the server requires.
function apiHeaders(json) {
  return json ? { "X-Lab-Token": token, "Content-Type": "application/json" } : { "X-Lab-Token": token };
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function showMessage(text) {
  $("message-text").textContent = text;
  $("message").hidden = false;
}
function clearMessage() { $("message").hidden = true; }

// POST (or GET without a body) to the API; a JSON {"error": ...} becomes a thrown Error with that text.
async function api(path, body) {
  const options = body === undefined ? { headers: apiHeaders(false) } : {
    method: "POST", headers: apiHeaders(true), body: JSON.stringify(body) };
  let response;
  try { response = await fetch(path, options); } catch (e) { throw new Error("the lab server does not answer"); }
  let data;
  try { data = await response.json(); } catch (e) { throw new Error(`the server sent no JSON (${response.status})`); }
  if (data.error) throw new Error(data.error);
  return data;
}

// Run an async action behind a button: the message bar shows its error, the status line its result.
async function guarded(button, status, action) {
  clearMessage();
  if (button) button.disabled = true;
  try { await action(); } catch (e) { showMessage(e.message); if (status) status.textContent = ""; }
  finally { if (button) button.disabled = false; }
}

function prompt() { return $("prompt").value; }

function settings() {
  const value = (id) => {
    // A number field's text the browser cannot parse ("1e", "0.8.1") reads as "", which the API takes as
    // no limit or temperature 0: refuse it here, naming the field, rather than sample with another setting.
    if ($(id).validity.badInput) throw new Error(`${id} is not a number; give one such as ${$(id).defaultValue || 1}`);
    return $(id).value.trim();
  };
  return { temperature: value("temperature"), top_k: value("top_k"), top_p: value("top_p"),
    seed: value("seed"), max_tokens: value("max_tokens") };
}

function showTab(name) {
  document.body.dataset.tab = name;
  for (const b of document.querySelectorAll(".tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const page of document.querySelectorAll(".tab-page")) page.hidden = page.id !== `tab-${name}`;
  if (name === "runs" && !$("runs-path").value && lab.info && lab.info.run_dir) $("runs-path").value = lab.info.run_dir;
}

function renderInfo(info) {
  lab.info = info;
  const fmt = (n) => n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : `${n}`;
  $("model-info").innerHTML = "";
  $("model-info").append(
    el("b", { text: info.checkpoint }), ` · step ${info.step ?? "?"} · ${info.n_layer} layers × ${info.n_head} heads` +
    ` · d_model ${info.d_model}, d_k ${info.d_k} · ${fmt(info.params)} params · ${info.tokenizer} vocab ` +
    `${info.vocab_size} · block ${info.block_size}`);
  document.dispatchEvent(new CustomEvent("lab:model", { detail: info }));
}

// Sample tab: newline-delimited JSON records arrive in HTTP chunks; each {"text"} is appended as it comes.
let sampleAbort = null;

async function runSample() {
  // The prompt as sent: the box may be edited while the answer streams in.
  const out = $("sample-output"), status = $("sample-status"), text = prompt();
  const started = performance.now();
  sampleAbort = new AbortController();
  status.textContent = "sampling…";
  const response = await fetch("/api/sample", { method: "POST", signal: sampleAbort.signal,
    headers: apiHeaders(true), body: JSON.stringify({ prompt: text, ...settings() }) });
  if (!response.ok) throw new Error((await response.json()).error);
  $("sample-stop").disabled = false;
  out.innerHTML = "";
  const generated = el("span", { class: "gen-text" });
  out.append(el("span", { class: "prompt-text", text }), generated);
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffered = "", tokens = 0;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop();
      for (const line of lines.filter(Boolean)) {
        const record = JSON.parse(line);
        if (record.error) throw new Error(record.error);
        if (record.text !== undefined) { generated.textContent += record.text; tokens += record.tokens; }
      }
      const seconds = (performance.now() - started) / 1000;
      status.textContent = `${tokens} tokens · ${(tokens / seconds).toFixed(0)} tokens/s`;
    }
    status.textContent += " · done";
  } catch (e) {
    if (e.name === "AbortError") status.textContent += " · stopped"; else throw e;
  } finally {
    $("sample-stop").disabled = true;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  // The tab is the URL's #fragment, so Back and Forward move between tabs and a reload keeps the tab.
  const tabOfUrl = () => {
    const name = location.hash.slice(1);
    return document.querySelector(`.tabs button[data-tab="${CSS.escape(name)}"]`) ? name : "sample";
  };
  for (const b of document.querySelectorAll(".tabs button")) {
    b.addEventListener("click", () => {
      if (tabOfUrl() !== b.dataset.tab) history.pushState(null, "", `#${b.dataset.tab}`);
      showTab(b.dataset.tab);
    });
  }
  window.addEventListener("popstate", () => showTab(tabOfUrl()));
  showTab(tabOfUrl());
  $("message-close").addEventListener("click", clearMessage);
  $("sample-run").addEventListener("click", () => guarded($("sample-run"), $("sample-status"), runSample));
  $("sample-stop").addEventListener("click", () => sampleAbort && sampleAbort.abort());
  $("load-form").addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(event.submitter, null, async () => renderInfo(await api("/api/load", { path: $("load-path").value })));
  });
  guarded(null, null, async () => renderInfo(await api("/api/info")));
});

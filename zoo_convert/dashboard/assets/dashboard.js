"use strict";
// Renders DATA (inlined by zoo_convert.dashboard.site) into the page; no libraries, charts are inline SVG.
// The data is a JSON island, not code: no string in it can be read as markup or script.
const DATA = JSON.parse(document.getElementById("zoo-data").textContent);
const ZOO = { loaded: {}, waiting: {} };
const VARIANTS = ["fp32", "fp16", "int8"];
const $ = (sel) => document.querySelector(sel);

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function num(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(1);
  return Number(v.toPrecision(digits)).toString();
}
function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
function badge(status) { return `<span class="badge ${esc(status || "none")}">${esc(status || "–")}</span>`; }
// Red at 0% through amber to green at 100%.
function heat(rate) { return `hsl(${Math.round(rate * 120)}, 65%, ${38 + rate * 4}%)`; }
function table(cols, rows, empty) {
  if (!rows.length) return `<p class="empty-note">${esc(empty)}</p>`;
  const head = cols.map((c) => `<th>${esc(c[0])}</th>`).join("");
  const body = rows.map((r) => "<tr>" + cols.map((c) => `<td${c[2] ? ' class="num"' : ""}>${c[1](r)}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function renderHeadline() {
  const h = DATA.headline;
  const rate = h.models ? h.passed / h.models : null;
  const cards = [
    [h.models, "models (latest result each)"],
    [pct(rate), `pass rate (${h.passed} passed)`],
    [h.median_speedup === null ? "–" : num(h.median_speedup, 3) + "×", "median fp32 speedup vs PyTorch"],
    [DATA.regressions.length, "regressions in the latest run"],
    [h.runs, "runs"],
    [h.result_rows, "result rows"],
  ];
  $("#headline").innerHTML = cards.map(([v, l]) => `<div class="card"><b>${esc(v)}</b><span>${esc(l)}</span></div>`).join("");
  $("#meta").textContent = `latest run ${h.latest_run ?? "–"} · generated ${DATA.generated_at}`;
}

function renderMatrix() {
  const variants = VARIANTS.filter((v) => DATA.matrix.some((m) => m.variant === v));
  const rows = new Map();
  for (const m of DATA.matrix) {
    const key = `${m.model_type}\u0000${m.opset ?? "default"}`;
    if (!rows.has(key)) rows.set(key, { model_type: m.model_type, opset: m.opset ?? "default", cells: {} });
    rows.get(key).cells[m.variant] = m;
  }
  if (!rows.size) { $("#matrix").innerHTML = '<p class="empty-note">no results yet</p>'; return; }
  let html = `<table class="heat"><thead><tr><th>model type</th><th>opset</th>${variants.map((v) => `<th>${v}</th>`).join("")}</tr></thead><tbody>`;
  for (const r of rows.values()) {
    html += `<tr><td>${esc(r.model_type)}</td><td>${esc(r.opset)}</td>`;
    for (const v of variants) {
      const c = r.cells[v];
      html += c
        ? `<td class="cell" style="background:${heat(c.pass_rate)}" title="${esc(c.failure_kinds.filter(Boolean).join(", "))}">${c.passed}/${c.models}</td>`
        : '<td class="empty"></td>';
    }
    html += "</tr>";
  }
  $("#matrix").innerHTML = html + "</tbody></table>";
}

function svgLine(points, { width = 360, height = 160, yMax = 1, label = pct } = {}) {
  if (!points.length) return '<p class="empty-note">no runs yet</p>';
  const pad = 40, w = width - 2 * pad, h = height - 2 * pad;
  const x = (i) => pad + (points.length === 1 ? w / 2 : (i * w) / (points.length - 1));
  const y = (v) => pad + h - (v / yMax) * h;
  const path = points.map((p, i) => `${x(i).toFixed(1)},${y(p.value).toFixed(1)}`).join(" ");
  const dots = points.map((p, i) => `<circle cx="${x(i).toFixed(1)}" cy="${y(p.value).toFixed(1)}" r="3" fill="#0969da"><title>${esc(p.label)}: ${label(p.value)}</title></circle>`).join("");
  const axis = [0, 0.5, 1].map((t) => `<text x="2" y="${(y(t * yMax) + 4).toFixed(1)}">${label(t * yMax)}</text><line x1="${pad}" x2="${width - pad}" y1="${y(t * yMax)}" y2="${y(t * yMax)}" stroke="#eaeef2"/>`).join("");
  const ends = points.length === 1
    ? `<text x="${x(0)}" y="${height - 6}" text-anchor="middle">${esc(points[0].label)}</text>`
    : `<text x="${pad}" y="${height - 6}">${esc(points[0].label)}</text><text x="${width - pad}" y="${height - 6}" text-anchor="end">${esc(points[points.length - 1].label)}</text>`;
  return `<svg viewBox="0 0 ${width} ${height}" width="100%">${axis}<polyline points="${path}" fill="none" stroke="#0969da" stroke-width="2"/>${dots}${ends}</svg>`;
}

function svgHist(rows, binLabel) {
  if (!rows.length) return '<p class="empty-note">no data</p>';
  const bins = [...new Set(rows.map((r) => r.bin))].sort((a, b) => a - b);
  const variants = VARIANTS.filter((v) => rows.some((r) => r.variant === v));
  const colors = { fp32: "#0969da", fp16: "#8250df", int8: "#bf8700" };
  const width = 360, height = 170, pad = 24, w = width - 2 * pad, h = height - 2 * pad - 10;
  const max = Math.max(...rows.map((r) => r.n));
  const bw = w / bins.length, sub = bw / variants.length;
  let bars = "";
  for (const r of rows) {
    const bh = (r.n / max) * h, bx = pad + bins.indexOf(r.bin) * bw + variants.indexOf(r.variant) * sub;
    bars += `<rect x="${bx.toFixed(1)}" y="${(pad + h - bh).toFixed(1)}" width="${Math.max(sub - 1, 1).toFixed(1)}" height="${bh.toFixed(1)}" fill="${colors[r.variant] || "#57606a"}"><title>${esc(r.variant)} ${binLabel(r.bin)}: ${r.n}</title></rect>`;
  }
  const step = Math.ceil(bins.length / 6);
  const ticks = bins.map((b, i) => (i % step ? "" : `<text x="${(pad + i * bw + bw / 2).toFixed(1)}" y="${pad + h + 14}" text-anchor="middle">${binLabel(b)}</text>`)).join("");
  const legend = variants.map((v, i) => `<rect x="${pad + i * 60}" y="4" width="10" height="10" fill="${colors[v]}"/><text x="${pad + i * 60 + 14}" y="13">${v}</text>`).join("");
  return `<svg viewBox="0 0 ${width} ${height}" width="100%">${legend}${bars}${ticks}</svg>`;
}

function renderCharts() {
  $("#passrate").innerHTML = svgLine(DATA.runs.filter((r) => r.jobs).map((r) => ({ label: r.run_id, value: r.passed / r.jobs })));
  $("#speedup").innerHTML = svgHist(DATA.speedup_hist, (b) => num(2 ** b, 2) + "×");
  $("#errors").innerHTML = svgHist(DATA.error_hist, (b) => "1e" + b);
}

function renderFailures() {
  const max = Math.max(1, ...DATA.failure_kinds.map((k) => k.n));
  $("#kinds").innerHTML = table(
    [["kind", (k) => esc(k.failure_kind)], ["stage", (k) => esc(k.stage)], ["models", (k) => k.n, true],
     ["", (k) => `<div class="bar" style="width:${(100 * k.n / max).toFixed(0)}px"></div>`]],
    DATA.failure_kinds, "no failures");
  $("#signatures").innerHTML = table(
    [["kind", (s) => esc(s.failure_kind)], ["n", (s) => s.n, true], ["models", (s) => s.models, true],
     ["signature", (s) => `<span class="msg" title="${esc(s.example)}">${esc(s.signature)}</span>`],
     ["e.g.", (s) => esc(s.sample_models.join(", "))]],
    DATA.signatures, "no failures");
  const latest = DATA.headline.latest_run;
  $("#regression-note").textContent = latest ? `in ${latest}, vs each model's latest earlier result` : "";
  $("#regressions").innerHTML = table(
    [["what", (r) => esc(r.regression)], ["model", (r) => esc(r.source)], ["exporter", (r) => esc(r.exporter)],
     ["opset", (r) => esc(r.opset ?? "default")], ["variant", (r) => esc(r.variant)], ["since", (r) => esc(r.previous_run_id)],
     ["max abs", (r) => `${num(r.previous_max_abs)} → ${num(r.max_abs)}`, true],
     ["ORT p50 ms", (r) => `${num(r.previous_ort_p50_ms)} → ${num(r.ort_p50_ms)}`, true],
     ["message", (r) => `<span class="msg">${esc(r.message)}</span>`]],
    DATA.regressions, "no regressions in the latest run");
}

const MODEL_COLS = [
  ["model", (m) => esc(m.source)], ["type", (m) => esc(m.model_type)], ["task", (m) => esc(m.task)],
  ["exporter", (m) => esc(m.exporter)], ["opset", (m) => esc(m.opset ?? "default")], ["status", (m) => badge(m.status)],
  ...VARIANTS.map((v) => [v, (m) => badge((m.variants || {})[v])]),
  ["max abs fp32", (m) => num(m.max_abs), true], ["speedup", (m) => (m.speedup ? num(m.speedup) + "×" : "–"), true],
  ["ORT p50 ms", (m) => num(m.ort_p50_ms), true], ["failure", (m) => esc(m.failure_kind)],
  ["message", (m) => `<span class="msg">${esc((m.message || "").slice(0, 120))}</span>`],
];

function fillSelect(id, values) {
  const sel = $(id);
  for (const v of [...new Set(values.filter((x) => x !== null && x !== undefined))].sort()) {
    const o = document.createElement("option");
    o.value = o.textContent = v;
    sel.appendChild(o);
  }
}

function renderModels() {
  $("#models thead").innerHTML = "<tr>" + MODEL_COLS.map((c) => `<th>${esc(c[0])}</th>`).join("") + "</tr>";
  fillSelect("#f-type", DATA.models.map((m) => m.model_type));
  fillSelect("#f-kind", DATA.models.map((m) => m.failure_kind));
  fillSelect("#f-exporter", DATA.models.map((m) => m.exporter));
  const shown = DATA.models.length;
  $("#model-note").textContent = shown < DATA.model_count
    ? `latest result per model; showing ${shown} of ${DATA.model_count} (failures first)` : "latest result per model; click a row for details";
  for (const id of ["#search", "#f-status", "#f-type", "#f-kind", "#f-exporter"]) $(id).addEventListener("input", filterModels);
  $("#models tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr");
    if (tr) openDetail(Number(tr.dataset.id));
  });
  filterModels();
}

function filterModels() {
  const q = $("#search").value.trim().toLowerCase();
  const want = { status: $("#f-status").value, model_type: $("#f-type").value, failure_kind: $("#f-kind").value, exporter: $("#f-exporter").value };
  const rows = DATA.models.filter((m) =>
    Object.entries(want).every(([k, v]) => !v || m[k] === v) &&
    (!q || [m.source, m.task, m.model_type, m.message, m.failure_kind].some((s) => (s || "").toLowerCase().includes(q))));
  $("#models tbody").innerHTML = rows.map((m) => `<tr data-id="${m.id}">` + MODEL_COLS.map((c) => `<td${c[2] ? ' class="num"' : ""}>${c[1](m)}</td>`).join("") + "</tr>").join("");
  $("#match-count").textContent = `${rows.length} shown`;
}

// Drill-down chunks are plain scripts calling ZOO.details({...}); they load from file:// as well as http.
ZOO.details = function (models) {
  Object.assign(ZOO.loaded, models);
  for (const id of Object.keys(models)) (ZOO.waiting[id] || []).forEach((f) => f(models[id]));
};

function loadDetail(id, then) {
  if (ZOO.loaded[id]) return then(ZOO.loaded[id]);
  (ZOO.waiting[id] = ZOO.waiting[id] || []).push(then);
  const src = `details/chunk-${Math.floor(id / DATA.chunk)}.js`;
  if (!document.querySelector(`script[src="${src}"]`)) {
    const s = document.createElement("script");
    s.src = src;
    document.body.appendChild(s);
  }
}

function openDetail(id) {
  const m = DATA.models.find((x) => x.id === id);
  document.querySelectorAll("#models tr.sel").forEach((tr) => tr.classList.remove("sel"));
  const tr = document.querySelector(`#models tr[data-id="${id}"]`);
  if (tr) tr.classList.add("sel");
  const drill = $("#drill");
  drill.hidden = false;
  drill.innerHTML = `<h2>${esc(m.source)} <small>${esc(m.exporter)} · opset ${esc(m.opset ?? "default")} · run ${esc(m.run)}</small></h2><p class="empty-note">loading…</p>`;
  loadDetail(id, (d) => renderDetail(m, d));
}

function renderDetail(m, d) {
  const st = d.stages || {};
  const versions = Object.entries(st.versions || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
  let html = `<h2>${esc(m.source)} <small>${esc(m.model_type)} · ${esc(m.task)} · ${esc(m.exporter)} · opset ${esc(m.opset ?? "default")} · run ${esc(m.run)} · attempts ${esc(m.attempts)} · node ${esc(m.node)}</small></h2>`;
  html += `<p class="msg">revision ${esc(st.resolved_revision)} · ${esc(versions)}<br>stages: fetch ${num(st.fetch_s)} s · export ${num(st.export_s)} s · check ${num(st.check_s)} s · optimize ${num(st.optimize_s)} s · peak ${num(m.peak_mem_mb)} MB</p>`;
  html += "<h3>Variants</h3>" + table(
    [["variant", (v) => esc(v.variant ?? "(none)")], ["status", (v) => badge(v.status)], ["max abs", (v) => num(v.max_abs), true],
     ["max rel", (v) => num(v.max_rel), true], ["min cosine", (v) => num(v.min_cosine, 6), true],
     ["ORT p50/p90 ms", (v) => `${num(v.ort_p50_ms)} / ${num(v.ort_p90_ms)}`, true],
     ["PyTorch p50/p90 ms", (v) => `${num(v.torch_p50_ms)} / ${num(v.torch_p90_ms)}`, true],
     ["speedup", (v) => (v.speedup ? num(v.speedup) + "×" : "–"), true], ["size MB", (v) => num(v.size_bytes / 1e6), true],
     ["failure", (v) => esc(v.failure_kind)], ["stage", (v) => esc(v.stage)], ["message", (v) => `<span class="msg">${esc(v.message)}</span>`]],
    d.variants || [], "no rows");
  const tb = (d.variants || []).map((v) => v.traceback).find(Boolean);
  if (tb) html += `<h3>Traceback</h3><pre>${esc(tb)}</pre>`;
  html += "<h3>Per-output errors</h3>" + table(
    [["variant", (o) => esc(o.variant)], ["output", (o) => esc(o.output)], ["shape", (o) => esc(o.shape)],
     ["max abs", (o) => num(o.max_abs), true], ["max rel", (o) => num(o.max_rel), true], ["cosine", (o) => num(o.cosine, 6), true],
     ["nan/inf", (o) => `${o.n_nan}/${o.n_inf}`, true], ["ok", (o) => badge(o.passed ? "passed" : "failed")]],
    d.outputs || [], "no verification numbers (the job failed before verify)");
  html += "<h3>Op census <small>fp32 graph</small></h3>" + ((d.census || []).length
    ? `<div class="ops">${d.census.map((o) => `<span>${esc(o.op)} ${o.n}</span>`).join("")}</div>`
    : '<p class="empty-note">no graph</p>');
  $("#drill").innerHTML = html;
}

renderHeadline();
renderMatrix();
renderCharts();
renderFailures();
renderModels();

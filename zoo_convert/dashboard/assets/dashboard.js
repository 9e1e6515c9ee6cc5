"use strict";
// Renders DATA (inlined by zoo_convert.dashboard.site) into the page; no libraries, charts are inline SVG.
// The data is a JSON island, not code: no string in it can be read as markup or script.
const DATA = JSON.parse(document.getElementById("zoo-data").textContent);
const ZOO = { loaded: {}, waiting: {} };
// Every variant some latest result has, in the farm's order (records.VARIANTS): opt-in ones appear once made.
const VARIANTS = DATA.variants.filter((v) => DATA.matrix.some((m) => m.variant === v));
// A model is passed (every variant verified), partial (converted: fp32 verified, another variant failed),
// failed (not converted) or inconclusive (its PyTorch reference proves nothing: neither converted nor failed);
// sorting by status puts the worst first.
const STATUS_ORDER = { failed: 0, inconclusive: 1, partial: 2, passed: 3 };
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
function runLabel(id, name) { return name ? `${name} (${id})` : id; }
function shortRev(rev) { return rev ? String(rev).replace(/^sha256:/, "").slice(0, 10) : "–"; }
// Red at 0% through amber to green at 100%.
function heat(rate) { return `hsl(${Math.round(rate * 120)}, 65%, ${38 + rate * 4}%)`; }
function table(cols, rows, empty) {
  if (!rows.length) return `<p class="empty-note">${esc(empty)}</p>`;
  const head = cols.map((c) => `<th>${esc(c[0])}</th>`).join("");
  const body = rows.map((r) => "<tr>" + cols.map((c) => `<td${c[2] ? ' class="num"' : ""}>${c[1](r)}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}
function jobStatus(jobStatus, variantStatuses) {
  if (jobStatus === "inconclusive") return "inconclusive";
  if (jobStatus !== "passed") return "failed";
  return variantStatuses.some((s) => s !== "passed") ? "partial" : "passed";
}

// The median is taken over the calm fp32 latencies only: say over how many models, and why the others are out.
function speedupNote(h) {
  const notTimed = h.models - h.speedup_n - h.speedup_noisy;
  const out = [h.speedup_noisy ? `${h.speedup_noisy} noisy (median not within ±${num(50 * DATA.noisy_ci, 2)}% or other processes on the CPUs it needed)` : null,
    notTimed ? `${notTimed} not timed (fp32 not verified, or no latency)` : null].filter(Boolean);
  return `median fp32 speedup vs PyTorch over ${h.speedup_n} of ${h.models} models`
    + (out.length ? `; ${h.models - h.speedup_n} left out: ${out.join(", ")}` : "");
}

function renderHeadline() {
  const h = DATA.headline;
  const cards = [
    [`${h.converted}/${h.models}`, "models converted (fp32 verified), latest result each"],
    [h.partial, "partial: converted, a variant failed"],
    [h.inconclusive, "inconclusive: the PyTorch reference proves nothing"],
    [h.models - h.converted - h.inconclusive, "not converted"],
    [`${h.variants_verified}/${h.variants}`, "variants verified (of those made)"],
    [h.median_speedup === null ? "–" : num(h.median_speedup, 3) + "×", speedupNote(h)],
    [DATA.regressions.length, "regressions in the latest run"],
  ];
  $("#headline").innerHTML = cards.map(([v, l]) => `<div class="card"><b>${esc(v)}</b><span>${esc(l)}</span></div>`).join("");
  $("#meta").textContent = `latest run ${h.latest_run ? runLabel(h.latest_run, h.latest_name) : "–"} · ${h.runs} runs · `
    + `${h.result_rows} result rows · generated ${DATA.generated_at}`;
}

// A model's readable name (its folder's last part, a Hub id as it is), its whole source in the title.
function modelName(m) { return `<span class="clamp" title="${esc(m.source)}">${esc(m.name ?? m.source)}</span>`; }
// A latency measured under noise is no figure to read: marked, never shown as a number (as the speedup leaves it out).
function p50(ms, noisy) { return noisy ? '<span class="noisy" title="measured under noise (spread or load): left out">noisy</span>' : num(ms); }

// A narrow column breaks a snake_case name after its underscores (verify_ numerics), not inside a word.
function breakable(name) {
  return esc(name).replaceAll("_", "_<wbr>");
}

// What broke: every model not passed, worst first, each opening its drill-down; the first screen's answer.
function renderBroke() {
  const broke = DATA.models.filter((m) => m.status !== "passed")
    .sort((a, b) => STATUS_ORDER[a.status] - STATUS_ORDER[b.status] || a.id - b.id);
  const counts = ["failed", "inconclusive", "partial"].map((s) => [s, broke.filter((m) => m.status === s).length]).filter(([, n]) => n);
  $("#broke-note").textContent = broke.length
    ? counts.map(([s, n]) => `${n} ${s === "failed" ? "not converted" : s}`).join(" · ") + " · click a row for details"
    : "latest result per model";
  $("#broke").innerHTML = broke.length ? `<div class="scroll short">${table(
    [["model", (m) => modelName(m)], ["type", (m) => breakable(m.model_type ?? "unknown")], ["status", (m) => badge(m.status)],
     ["failed", (m) => esc(VARIANTS.filter((v) => (m.failed_variants || []).includes(v)).join(" ") || (m.status === "failed" ? "all" : "–"))],
     ["failure", (m) => breakable(m.failure_kind)],
     ["message", (m) => `<span class="msg clamp" title="${esc(m.message)}">${esc(m.message)}</span>`]],
    broke, "")}</div>` : '<p class="empty-note">nothing broke: every model of the latest results passed</p>';
  $("#broke").querySelectorAll("tbody tr").forEach((tr, i) => {
    tr.dataset.id = broke[i].id;
    tr.addEventListener("click", () => showModel(broke[i]));
  });
}

// Where each variant runs and how fast: one row per target and variant (DATA.targets): ONNX Runtime's verdict on
// the CPU that converted it first, then each deployment target (compat_by_target) with its version.
function notPassed(t) {
  return [[t.failed, "failed"], [t.unsupported, "unsupported"], [t.other, t.target === "ort-cpu" ? "other" : "not run"]]
    .filter(([n]) => n).map(([n, s]) => `${n} ${s}`).join(", ") || "–";
}
function targetName(t) {
  return `<span title="${esc(t.label)}">${esc(t.target)}</span>` + (t.version ? ` <small class="ver">${esc(t.version)}</small>` : "");
}
function renderTargets() {
  const rows = DATA.targets || [];
  $("#targets").innerHTML = table(
    [["target", (t) => targetName(t)], ["variant", (t) => esc(t.variant)],
     ["passed", (t) => `${t.passed}/${t.models}`, true], ["not passed", (t) => esc(notPassed(t))],
     ["p50 ms", (t) => `<span title="median over ${t.timed} ${t.noisy == null ? "passed rows (5 calls of the first saved case)" : `calm latencies; ${t.noisy} noisy left out`}">${num(t.median_p50_ms)}</span>`, true],
     ["noisy", (t) => (t.noisy == null ? "–" : t.noisy), true]],
    rows, "no results yet");
}

function renderMatrix() {
  const rows = new Map();
  for (const m of DATA.matrix) {
    const key = JSON.stringify([m.model_type, m.task, m.opset]);
    if (!rows.has(key)) rows.set(key, { model_type: m.model_type, task: m.task, opset: m.opset ?? "–", cells: {} });
    rows.get(key).cells[m.variant] = m;
  }
  if (!rows.size) { $("#matrix").innerHTML = '<p class="empty-note">no results yet</p>'; return; }
  const broken = (r) => Object.values(r.cells).some((c) => c.passed < c.models);
  const ordered = [...rows.values()].sort((a, b) => broken(b) - broken(a));
  let html = `<table class="heat"><thead><tr><th>model type</th><th>task</th><th>opset</th>${VARIANTS.map((v) => `<th>${v}</th>`).join("")}</tr></thead><tbody>`;
  for (const r of ordered) {
    html += `<tr><td>${esc(r.model_type)}</td><td>${esc(r.task ?? "–")}</td><td class="num">${esc(r.opset)}</td>`;
    for (const v of VARIANTS) {
      const c = r.cells[v];
      if (!c) { html += '<td class="empty"></td>'; continue; }
      // An inconclusive cell is not a pass: counted apart, marked with "?" and named in the title.
      const why = [...c.failure_kinds.filter(Boolean), ...(c.inconclusive ? [`${c.inconclusive} inconclusive`] : [])];
      const mark = c.inconclusive ? ` <span class="inconclusive-mark">${c.inconclusive}?</span>` : "";
      html += `<td class="cell" style="background:${heat(c.pass_rate)}" title="${esc(why.join(", "))}">${c.passed}/${c.models}${mark}</td>`;
    }
    html += "</tr>";
  }
  $("#matrix").innerHTML = html + "</tbody></table>";
}

// The zoo after each run: share of models converted and of variants verified, one point per run.
function svgRuns(runs) {
  const points = runs.filter((r) => r.models);
  if (!points.length) return '<p class="empty-note">no runs yet</p>';
  const width = 360, height = 190, left = 48, right = 14, top = 24, bottom = 30;
  const w = width - left - right, h = height - top - bottom;
  const x = (i) => left + (points.length === 1 ? w / 2 : (i * w) / (points.length - 1));
  const y = (v) => top + h - v * h;
  const series = [
    { name: "models converted", color: "#0969da", value: (r) => r.converted / r.models, text: (r) => `${r.converted}/${r.models} models converted` },
    { name: "variants verified", color: "#8250df", value: (r) => (r.variants ? r.verified / r.variants : null), text: (r) => `${r.verified}/${r.variants} variants verified` },
  ];
  let svg = [0, 0.5, 1].map((t) => `<text x="2" y="${(y(t) + 4).toFixed(1)}">${pct(t)}</text><line x1="${left}" x2="${width - right}" y1="${y(t)}" y2="${y(t)}" stroke="#eaeef2"/>`).join("");
  series.forEach((s, k) => {
    const pts = points.map((r, i) => [i, s.value(r), r]).filter((p) => p[1] !== null);
    svg += `<polyline points="${pts.map(([i, v]) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ")}" fill="none" stroke="${s.color}" stroke-width="2"/>`;
    svg += pts.map(([i, v, r]) => `<circle cx="${x(i).toFixed(1)}" cy="${y(v).toFixed(1)}" r="3" fill="${s.color}"><title>${esc(runLabel(r.run_id, r.label))}: ${esc(s.text(r))} (${pct(v)})</title></circle>`).join("");
    svg += `<rect x="${left + k * 130}" y="4" width="10" height="10" fill="${s.color}"/><text x="${left + k * 130 + 14}" y="13">${s.name}</text>`;
  });
  svg += points.map((r, i) => {
    const anchor = points.length === 1 ? "middle" : i === 0 ? "start" : i === points.length - 1 ? "end" : "middle";
    return `<text class="xlabel" x="${x(i).toFixed(1)}" y="${height - 8}" text-anchor="${anchor}">${esc(r.label)}<title>${esc(runLabel(r.run_id, r.label))}</title></text>`;
  }).join("");
  return `<svg viewBox="0 0 ${width} ${height}" width="100%">${svg}</svg>`;
}

// Run labels that would touch their neighbour are dropped, measured as drawn; the first and last stay.
function thinLabels(svg) {
  const labels = [...svg.querySelectorAll("text.xlabel")];
  if (labels.length < 2) return;
  const last = labels[labels.length - 1].getBBox();
  let kept = null;
  for (const t of labels.slice(0, -1)) {
    const b = t.getBBox();
    if ((kept && b.x < kept.x + kept.width + 6) || b.x + b.width + 6 > last.x) t.remove();
    else kept = b;
  }
}

function svgHist(rows, binLabel) {
  if (!rows.length) return '<p class="empty-note">no data</p>';
  const bins = [...new Set(rows.map((r) => r.bin))].sort((a, b) => a - b);
  const variants = VARIANTS.filter((v) => rows.some((r) => r.variant === v));
  const colors = { fp32: "#0969da", fp16: "#8250df", int8: "#bf8700", uint8: "#1a7f37", q4: "#cf222e" };
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
  $("#passrate").innerHTML = svgRuns(DATA.runs);
  const svg = $("#passrate svg");
  if (svg) thinLabels(svg);
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
     ["e.g.", (s) => `<span title="${esc(s.sample_models.join("\n"))}">${esc((s.sample_names || s.sample_models).join(", "))}</span>`]],
    DATA.signatures, "no failures");
  $("#target-signatures").innerHTML = table(
    [["target", (s) => esc(s.target)], ["status", (s) => badge(s.status)], ["n", (s) => s.n, true], ["models", (s) => s.models, true],
     ["signature", (s) => `<span class="msg clamp" title="${esc(s.example)}">${esc(s.signature)}</span>`],
     ["e.g.", (s) => `<span title="${esc(s.sample_models.join("\n"))}">${esc((s.sample_names || s.sample_models).join(", "))}</span>`]],
    DATA.target_signatures || [], "no failures on the deployment targets (or none checked)");
  const h = DATA.headline;
  $("#regression-note").textContent = h.latest_run ? `in ${runLabel(h.latest_run, h.latest_name)}, vs each model's latest earlier result` : "";
  $("#regressions").innerHTML = table(
    [["what", (r) => esc(r.regression)], ["model", (r) => modelName(r)], ["exporter", (r) => esc(r.exporter)],
     ["opset", (r) => esc(r.opset ?? "–"), true], ["variant", (r) => esc(r.variant)], ["since", (r) => esc(r.since_run)],
     ["what changed", (r) => `<span class="msg">${esc(r.changed)}</span>`],
     ["max abs", (r) => `${num(r.previous_max_abs)} → ${num(r.max_abs)}`, true],
     ["ORT p50 ms", (r) => `${num(r.previous_ort_p50_ms)} → ${num(r.ort_p50_ms)}`, true],
     // slower weighs ONNX Runtime's move against PyTorch's in the same job: both shown.
     ["PyTorch p50 ms", (r) => `${num(r.previous_torch_p50_ms)} → ${num(r.torch_p50_ms)}`, true],
     ["message", (r) => `<span class="msg">${esc(r.message)}</span>`]],
    DATA.regressions, "no regressions in the latest run");
}

// Each column: header, cell HTML, the raw value it sorts and exports by, and whether it is a number.
const MODEL_COLS = [
  { name: "model", html: (m) => modelName(m), value: (m) => m.name ?? m.source, cls: "c-model" },
  { name: "type", html: (m) => esc(m.model_type ?? "unknown"), value: (m) => m.model_type },
  { name: "task", html: (m) => esc(m.task), value: (m) => m.task, cls: "c-minor" },
  { name: "exporter", html: (m) => esc(m.exporter), value: (m) => m.exporter, cls: "c-minor" },
  { name: "opset", html: (m) => esc(m.opset ?? "–"), value: (m) => m.opset, num: true },
  { name: "status", html: (m) => badge(m.status), value: (m) => m.status, sort: (m) => STATUS_ORDER[m.status] },
  ...VARIANTS.map((v) => ({ name: v, html: (m) => badge((m.variants || {})[v]), value: (m) => (m.variants || {})[v] ?? null })),
  { name: "max abs fp32", html: (m) => num(m.max_abs), value: (m) => m.max_abs, num: true },
  { name: "speedup", html: (m) => (m.speedup ? num(m.speedup) + "×" : "–"), value: (m) => m.speedup, num: true },
  { name: "ORT p50 ms", html: (m) => p50(m.ort_p50_ms, m.ort_p50_noisy), value: (m) => (m.ort_p50_noisy ? null : m.ort_p50_ms), num: true, cls: "c-minor" },
  { name: "failure", html: (m) => esc(m.failure_kind), value: (m) => m.failure_kind, cls: "c-kind" },
  // Two lines at most, so a failure row stays a row; the whole message is in its title and the drill-down.
  { name: "message", html: (m) => `<span class="msg clamp" title="${esc(m.message)}">${esc(m.message)}</span>`, value: (m) => m.message, cls: "c-message" },
];
function colClass(c) { return [c.num ? "num" : "", c.cls || ""].filter(Boolean).join(" "); }
const SORT = { col: null, dir: 1 };
let shownModels = [];

function fillSelect(id, values) {
  const sel = $(id);
  for (const v of [...new Set(values.filter((x) => x !== null && x !== undefined))].sort()) {
    const o = document.createElement("option");
    o.value = o.textContent = v;
    sel.appendChild(o);
  }
}

function renderModels() {
  $("#models thead").innerHTML = "<tr>" + MODEL_COLS.map((c, i) => `<th class="sortable ${colClass(c)}" data-col="${i}" title="sort">${esc(c.name)}</th>`).join("") + "</tr>";
  $("#models thead").addEventListener("click", (e) => {
    const th = e.target.closest("th");
    if (!th) return;
    const col = Number(th.dataset.col);
    SORT.dir = SORT.col === col ? -SORT.dir : 1;
    SORT.col = col;
    filterModels();
  });
  fillSelect("#f-type", DATA.models.map((m) => m.model_type));
  fillSelect("#f-kind", DATA.models.map((m) => m.failure_kind));
  fillSelect("#f-exporter", DATA.models.map((m) => m.exporter));
  const shown = DATA.models.length;
  $("#model-note").textContent = shown < DATA.model_count
    ? `latest result per model; showing ${shown} of ${DATA.model_count} (failures first)` : "latest result per model; click a row for details, a header to sort";
  for (const id of ["#search", "#f-status", "#f-type", "#f-kind", "#f-exporter"]) $(id).addEventListener("input", filterModels);
  $("#models tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr");
    if (tr) showModel(DATA.models.find((m) => m.id === Number(tr.dataset.id)));
  });
  $("#csv").addEventListener("click", () => {
    const old = $("#csv").href;
    if (old.startsWith("blob:")) URL.revokeObjectURL(old);
    $("#csv").href = URL.createObjectURL(new Blob([ZOO.modelsCsv()], { type: "text/csv" }));
  });
  filterModels();
}

// Nulls sort last either way; numbers as numbers, text by the reader's collation.
function compareBy(col, dir) {
  const key = col.sort || col.value;
  return (a, b) => {
    const x = key(a), y = key(b);
    if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1;
    if (y === null || y === undefined) return -1;
    return dir * (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y)));
  };
}

function filterModels() {
  const q = $("#search").value.trim().toLowerCase();
  const status = $("#f-status").value;
  const want = { model_type: $("#f-type").value, failure_kind: $("#f-kind").value, exporter: $("#f-exporter").value };
  let rows = DATA.models.filter((m) =>
    (!status || (status === "problem" ? m.status !== "passed" : m.status === status)) &&
    Object.entries(want).every(([k, v]) => !v || m[k] === v) &&
    (!q || [m.source, m.name, m.task, m.model_type, m.message, m.failure_kind].some((s) => (s || "").toLowerCase().includes(q))));
  if (SORT.col !== null) rows = rows.slice().sort(compareBy(MODEL_COLS[SORT.col], SORT.dir));
  shownModels = rows;
  document.querySelectorAll("#models thead th").forEach((th, i) => {
    if (i === SORT.col) th.setAttribute("aria-sort", SORT.dir > 0 ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  });
  $("#models tbody").innerHTML = rows.map((m) => `<tr data-id="${m.id}">` + MODEL_COLS.map((c) => `<td${colClass(c) ? ` class="${colClass(c)}"` : ""}>${c.html(m)}</td>`).join("") + "</tr>").join("");
  $("#match-count").textContent = `${rows.length} shown`;
}

// The rows shown (filtered and sorted) with raw values: nothing rounded or cut.
ZOO.modelsCsv = function () {
  const cols = [["name", (m) => m.name], ["source", (m) => m.source], ["model_type", (m) => m.model_type], ["task", (m) => m.task],
    ["exporter", (m) => m.exporter], ["opset", (m) => m.opset], ["revision", (m) => m.revision], ["status", (m) => m.status],
    ...VARIANTS.map((v) => [v, (m) => (m.variants || {})[v]]), ["max_abs_fp32", (m) => m.max_abs],
    ["speedup", (m) => m.speedup], ["ort_p50_ms", (m) => m.ort_p50_ms], ["ort_p50_noisy", (m) => m.ort_p50_noisy], ["failure_kind", (m) => m.failure_kind],
    ["message", (m) => m.message], ["run", (m) => m.run]];
  return [cols.map((c) => c[0]), ...shownModels.map((m) => cols.map((c) => c[1](m)))].map((r) => r.map(csvCell).join(",")).join("\r\n") + "\r\n";
};

function csvCell(v) {
  if (v === null || v === undefined) return "";
  let s = String(v);
  // a spreadsheet would run a cell starting with = + - @ as a formula
  if (typeof v === "string" && /^[=+\-@\t\r]/.test(s)) s = "'" + s;
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

// Every drill-down has its own address: #model=SOURCE[&exporter=..][&opset=..][&revision=..].
function modelHash(m) {
  const p = new URLSearchParams({ model: m.source, exporter: m.exporter });
  if (m.opset_requested !== null && m.opset_requested !== undefined) p.set("opset", m.opset_requested);
  if (m.revision) p.set("revision", m.revision);
  return "#" + p.toString();
}

function showModel(m) {
  if (!m) return;
  const hash = modelHash(m);
  if (location.hash === hash) route(true);
  else location.hash = hash;
}

// The drill-down follows the address: back to an address without a model closes it. Both hashchange and
// popstate fire on a back over a #fragment; the one routed already is not drawn twice.
let routedHash = null;
function route(force = false) {
  if (!force && location.hash === routedHash) return;
  routedHash = location.hash;
  const p = new URLSearchParams(location.hash.slice(1));
  if (!p.has("model")) {
    $("#drill").hidden = true;
    $("#drill").innerHTML = "";
    document.querySelectorAll("#models tr.sel").forEach((tr) => tr.classList.remove("sel"));
    return;
  }
  const m = DATA.models.find((x) => x.source === p.get("model") && (!p.has("exporter") || x.exporter === p.get("exporter")) &&
    String(x.opset_requested ?? "") === (p.get("opset") ?? "") && (x.revision ?? "") === (p.get("revision") ?? ""));
  const drill = $("#drill");
  drill.hidden = false;
  if (!m) {
    drill.innerHTML = `<h2>${esc(p.get("model"))}</h2><p class="empty-note">not in this page's table (it holds ${DATA.models.length} of ${DATA.model_count} models, failures first)</p>`;
  } else {
    openDetail(m.id);
  }
  drill.scrollIntoView({ block: "nearest" });
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
  drill.innerHTML = `<h2>${esc(m.name ?? m.source)} <small>${esc(m.exporter)} · opset ${esc(m.opset ?? "–")} · run ${esc(m.run)}</small></h2><p class="empty-note">loading…</p>`;
  loadDetail(id, (d) => renderDetail(m, d));
}

function tolerances(text) {
  try { return JSON.parse(text || "null") || {}; } catch { return {}; }
}
function tolerance(t) {
  if (!t) return "–";
  const maxAbs = Number(t.max_abs);  // "inf" (no limit) is recorded as text
  return [isFinite(maxAbs) ? `max abs ≤ ${num(maxAbs)}` : null, t.min_cosine ? `cos ≥ ${t.min_cosine}` : null].filter(Boolean).join(" · ") || "none";
}
function link(url, text) {
  return /^https?:\/\//.test(url || "") ? `<a href="${esc(url)}" rel="noopener noreferrer">${esc(text)}</a>` : esc(text);
}

// How a latency was taken: a figure without its threads, shape, CPU and load cannot be compared.
function conditions(v) {
  if (v.bench_note) return v.bench_note;
  if (v.bench_threads == null) return "";
  const spread = [v.ort_spread, v.torch_spread].filter((s) => s != null).map((s) => num(100 * s, 2) + "%").join(" / ");
  return `${v.bench_threads} thread(s) · ${v.bench_shape ?? "?"} · ${v.bench_cpu ?? "?"} · others busy on ${num(v.bench_load, 2)} CPUs`
    + (spread ? ` · spread ${spread}` : "") + (v.bench_noisy ? " · noisy: left out of the speedups" : "");
}

function renderDetail(m, d) {
  const st = d.stages || {};
  const tol = tolerances(st.tolerances);
  const versions = Object.entries(st.versions || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
  let html = `<h2>${esc(m.name ?? m.source)} <small>${esc(m.model_type ?? "unknown type")} · ${esc(m.task)} · ${esc(m.exporter)} · opset ${esc(m.opset ?? "–")} · run ${esc(m.run)} · attempts ${esc(m.attempts)} · node ${esc(m.node)}</small></h2>`;
  html += `<p class="msg">revision ${esc(st.resolved_revision)} · ${esc(versions)}<br>stages: fetch ${num(st.fetch_s)} s · export ${num(st.export_s)} s · check ${num(st.check_s)} s · optimize ${num(st.optimize_s)} s · peak ${num(m.peak_mem_mb)} MB</p>`;
  const pub = d.publication;
  html += '<dl class="facts">'
    + `<dt>source</dt><dd><code>${esc(m.source)}</code></dd>`
    + `<dt>artifacts</dt><dd>${st.artifacts_dir ? `<code>${esc(st.artifacts_dir)}</code>` : "none (the job failed before any artifact)"}</dd>`
    + `<dt>published</dt><dd>${pub ? `${link(pub.commit_url, pub.repo_id)} · ${esc(pub.status)} · ${esc(pub.published_at)}` : "not published"}</dd>`
    + "</dl>";
  html += "<h3>Variants</h3>" + table(
    [["variant", (v) => esc(v.variant ?? "(none)")], ["status", (v) => badge(v.status)],
     ["tolerance", (v) => esc(tolerance(tol[v.variant]))], ["max abs", (v) => num(v.max_abs), true],
     ["max rel", (v) => num(v.max_rel), true], ["min cosine", (v) => num(v.min_cosine, 6), true],
     ["ORT p50/p90 ms", (v) => (v.bench_noisy ? p50(v.ort_p50_ms, true) : `${num(v.ort_p50_ms)} / ${num(v.ort_p90_ms)}`), true],
     ["PyTorch p50/p90 ms", (v) => (v.bench_noisy ? p50(v.torch_p50_ms, true) : `${num(v.torch_p50_ms)} / ${num(v.torch_p90_ms)}`), true],
     ["speedup", (v) => (v.bench_noisy ? p50(v.speedup, true) : v.speedup ? num(v.speedup) + "×" : "–"), true],
     ["latency conditions", (v) => `<span class="msg">${esc(conditions(v))}</span>`],
     ["size MB", (v) => (v.status === "passed" && v.size_bytes ? num(v.size_bytes / 1e6) : "–"), true],
     ["failure", (v) => esc(v.failure_kind)], ["stage", (v) => esc(v.stage)], ["message", (v) => `<span class="msg">${esc(v.message)}</span>`]],
    d.variants || [], "no rows");
  // Where it runs: ONNX Runtime's verdict, then each deployment target, per variant, with version and latency.
  html += "<h3>Runs in <small>per variant and target: ort-cpu is verify's verdict (its benchmark latency), the others re-ran the saved reference (p50 of 5 calls of its first case)</small></h3>" + table(
    [["target", (t) => `<span title="${esc(t.providers || "")}">${esc(t.target)}</span>`], ["variant", (t) => esc(t.variant)],
     ["status", (t) => badge(t.status)], ["version", (t) => esc(t.version ?? "–")],
     ["max abs", (t) => num(t.max_abs), true], ["p50 ms", (t) => p50(t.p50_ms, t.noisy), true],
     ["message", (t) => `<span class="msg">${esc(t.status === "passed" ? "" : t.message)}</span>`]],
    d.targets || [], "no target rows (the job failed before verify)");
  // A decoder is used by generating: ORT's own cache over the steps, against PyTorch generate().
  const generated = (d.variants || []).filter((v) => v.generation_steps || v.generation_note);
  if (generated.length) html += "<h3>Generation <small>greedy, ORT's own cache from an empty past, teacher-forced on PyTorch generate()'s tokens; per step in the per-output errors (…/stepNN)</small></h3>" + table(
    [["variant", (v) => esc(v.variant)], ["steps", (v) => esc(v.generation_steps ?? "–"), true],
     ["max abs", (v) => num(v.generation_max_abs), true], ["min cosine", (v) => num(v.generation_min_cosine, 6), true],
     ["greedy tokens = PyTorch", (v) => pct(v.generation_token_match), true],
     ["note", (v) => `<span class="msg">${esc(v.generation_note)}</span>`]],
    generated, "no rows");
  const tb = (d.variants || []).map((v) => v.traceback).find(Boolean);
  if (tb) html += `<h3>Traceback</h3><pre>${esc(tb)}</pre>`;
  html += `<h3>History <small>the model's last ${(d.history || []).length} jobs, newest first</small></h3>` + table(
    [["run", (j) => esc(j.run)], ["started", (j) => esc(j.started_at), true],
     ["status", (j) => badge(jobStatus(j.job_status, VARIANTS.map((v) => j[v]).filter(Boolean)))],
     ...VARIANTS.map((v) => [v, (j) => badge(j[v])]),
     ["max abs fp32", (j) => num(j.max_abs), true], ["ORT p50 ms", (j) => p50(j.ort_p50_ms, j.ort_p50_noisy), true],
     ["checkpoint", (j) => `<code>${esc(shortRev(j.resolved_revision))}</code>`], ["failure", (j) => esc(j.failure_kind)]],
    d.history || [], "no history");
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
renderBroke();
renderTargets();
renderMatrix();
renderCharts();
renderFailures();
renderModels();
window.addEventListener("hashchange", () => route());
window.addEventListener("popstate", () => route());
route();

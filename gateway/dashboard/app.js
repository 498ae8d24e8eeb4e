// Spillway dashboard: polls /admin/status (with the admin token the operator
// typed, kept in sessionStorage) and /metrics once a second, and draws its
// own charts on canvases. Nothing is fetched from outside this origin (the
// gateway's Content-Security-Policy enforces it). Every field the gateway
// may not have yet (older gateways) is shown only when present.
"use strict";

const TOKEN_KEY = "spillway-admin-token";
const POLL_MS = 1000;
const HISTORY = 300;          // samples kept: 5 minutes at one a second
const QWINDOW = 10;           // seconds of histogram deltas behind each TTFT point
const COLORS = ["#58a6ff", "#f85149", "#3fb950", "#d29922", "#bc8cff", "#39c5cf", "#ff7b72", "#e3b341"];

const $ = (id) => document.getElementById(id);
let samples = [];             // {t, m (parsed metrics)}
let timer = null;

// ---- DOM helpers (textContent only: worker ids and reasons are not trusted) ----
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function row(cells, cls) {
  const tr = el("tr", cls);
  for (const c of cells) {
    const td = el("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c === undefined || c === null ? "-" : String(c);
    tr.appendChild(td);
  }
  return tr;
}
function table(id, head, rows) {
  const t = $(id);
  t.replaceChildren();
  const tr = el("tr");
  for (const h of head) tr.appendChild(el("th", null, h));
  t.appendChild(tr);
  for (const r of rows) t.appendChild(r);
  if (!rows.length) t.appendChild(row(["(none)"]));
}
function bar(v, max) {
  const b = el("span", "bar");
  const i = el("i");
  const f = max > 0 ? Math.min(1, v / max) : 0;
  i.style.width = (f * 100).toFixed(0) + "%";
  if (max > 0 && v >= max) b.classList.add("full");
  b.appendChild(i);
  return b;
}
function fmt(v, d) { return typeof v === "number" && isFinite(v) ? v.toFixed(d === undefined ? 0 : d) : "-"; }
function pct(v) { return typeof v === "number" && isFinite(v) ? (v * 100).toFixed(0) + "%" : "-"; }

// ---- Prometheus text exposition -> {name: [{labels, value}]} ----
function parseMetrics(text) {
  const out = {};
  const re = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const lre = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = re.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const l of m[2].matchAll(lre)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    const v = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : parseFloat(m[3]);
    (out[m[1]] = out[m[1]] || []).push({ labels, value: v });
  }
  return out;
}
// Sum of a metric's samples grouped by key(labels).
function sumBy(m, name, key) {
  const r = {};
  for (const s of m[name] || []) { const k = key(s.labels); r[k] = (r[k] || 0) + s.value; }
  return r;
}
function lookup(m, name, label, value) {
  for (const s of m[name] || []) if (s.labels[label] === value) return s.value;
  return undefined;
}

// histogram_quantile over summed buckets: {le: count} cumulative, linear inside a bucket.
function quantile(q, buckets) {
  const les = Object.keys(buckets).map(Number).sort((a, b) => a - b);
  if (!les.length) return null;
  const total = buckets[String(les[les.length - 1])] !== undefined ? buckets[les[les.length - 1]] : 0;
  const n = buckets[Infinity] !== undefined ? buckets[Infinity] : total;
  if (!(n > 0)) return null;
  const rank = q * n;
  let prevLe = 0, prevC = 0;
  for (const le of les) {
    const c = buckets[le];
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + (le - prevLe) * (c - prevC > 0 ? (rank - prevC) / (c - prevC) : 0);
    }
    prevLe = le; prevC = c;
  }
  return prevLe;
}
function bucketsOf(m, name) {
  const b = {};
  for (const s of m[name + "_bucket"] || []) {
    const le = s.labels.le === "+Inf" ? Infinity : parseFloat(s.labels.le);
    b[le] = (b[le] || 0) + s.value;
  }
  return b;
}

// ---- series derived from the samples ----
function rateSeries(fn) {
  // per-second rate of counters summed by key: [{key, pts:[{t,v}]}]
  const keys = new Map();
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = (b.t - a.t) / 1000;
    const va = fn(a.m), vb = fn(b.m);
    for (const k of Object.keys(vb)) {
      if (!keys.has(k)) keys.set(k, []);
      const d = vb[k] - (va[k] || 0);
      keys.get(k).push({ t: b.t, v: dt > 0 && d >= 0 ? d / dt : 0 });
    }
  }
  return [...keys].map(([key, pts]) => ({ key, pts }));
}
function overflowByReason(m) {
  return sumBy(m, "spillway_overflow_total", (l) => l.reason || "other");
}
function ttftSeries() {
  const p50 = [], p99 = [];
  for (let i = 1; i < samples.length; i++) {
    const b = samples[i], a = samples[Math.max(0, i - QWINDOW)];
    const nb = bucketsOf(b.m, "spillway_time_to_first_token_seconds");
    const na = bucketsOf(a.m, "spillway_time_to_first_token_seconds");
    const d = {};
    for (const k of Object.keys(nb)) d[k === "Infinity" ? Infinity : k] = nb[k] - (na[k] || 0);
    p50.push({ t: b.t, v: quantile(0.5, d) });
    p99.push({ t: b.t, v: quantile(0.99, d) });
  }
  return [{ key: "p50", pts: p50 }, { key: "p99", pts: p99 }];
}
function tpsSeries() {
  const last = samples.length ? samples[samples.length - 1].m : {};
  if (last.spillway_worker_tokens_per_second) {
    const keys = new Set();
    for (const s of samples) for (const x of s.m.spillway_worker_tokens_per_second || []) keys.add(x.labels.pool || "pool");
    return [...keys].map((k) => ({ key: k, pts: samples.map((s) => ({ t: s.t, v: sumBy(s.m, "spillway_worker_tokens_per_second", (l) => l.pool || "pool")[k] || 0 })) }));
  }
  return rateSeries((m) => ({ completion: (m.spillway_completion_tokens_total || []).reduce((a, s) => a + s.value, 0) }));
}

// ---- a line chart on a canvas, sized to its box and the screen's pixel ratio ----
function drawChart(canvas, legend, series, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.max(1, Math.round(w * dpr));
  canvas.height = Math.max(1, Math.round(h * dpr));
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const now = Date.now(), t0 = now - HISTORY * POLL_MS;
  let ymax = 0;
  for (const s of series) for (const p of s.pts) if (p.v !== null && isFinite(p.v)) ymax = Math.max(ymax, p.v);
  ymax = ymax > 0 ? ymax * 1.15 : 1;
  const L = 42, R = 6, T = 8, Bm = 18;
  const x = (t) => L + ((t - t0) / (now - t0)) * (w - L - R);
  const y = (v) => T + (1 - v / ymax) * (h - T - Bm);
  g.strokeStyle = "#2a323b"; g.fillStyle = "#8a949e"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4, yy = y(v);
    g.beginPath(); g.moveTo(L, yy); g.lineTo(w - R, yy); g.stroke();
    g.fillText(v < 10 ? v.toFixed(v < 1 ? 3 : 1) : v.toFixed(0), 2, yy + 4);
  }
  g.fillText("-5 min", L, h - 4);
  g.fillText("now", w - R - 22, h - 4);
  legend.replaceChildren();
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    g.strokeStyle = color; g.lineWidth = 1.5; g.beginPath();
    let pen = false;
    for (const p of s.pts) {
      if (p.t < t0 || p.v === null || !isFinite(p.v)) { pen = false; continue; }
      if (pen) g.lineTo(x(p.t), y(p.v)); else g.moveTo(x(p.t), y(p.v));
      pen = true;
    }
    g.stroke();
    // the latest point as a dot: seconds of history are a sliver at the right edge
    const lastp = s.pts.length ? s.pts[s.pts.length - 1] : null;
    if (lastp && lastp.v !== null && isFinite(lastp.v)) {
      g.fillStyle = color; g.beginPath(); g.arc(x(lastp.t), y(lastp.v), 3, 0, 2 * Math.PI); g.fill();
    }
    const li = el("li");
    const sw = el("b"); sw.style.background = color;
    li.appendChild(sw);
    li.appendChild(document.createTextNode(s.key + (s.label !== undefined ? ": " + s.label : "")));
    li.dataset.key = s.key;
    legend.appendChild(li);
  });
  if (!series.length) legend.appendChild(el("li", null, "no data yet" + (unit ? " (" + unit + ")" : "")));
}

// ---- tables ----
function renderPools(st, m) {
  const rows = (st.pools || []).map((p) => {
    const healthy = lookup(m, "spillway_pool_healthy_workers", "pool", p.name);
    const cost = typeof p.dollars_per_million_tokens === "number" ? p.dollars_per_million_tokens
      : lookup(m, "spillway_pool_dollars_per_million_tokens", "pool", p.name);
    const state = p.cordoned ? "cordoned" + (p.cordon_reason ? ": " + p.cordon_reason : "") : "open";
    const maxc = lookup(m, "spillway_pool_max_concurrency", "pool", p.name);
    const r = row([p.name, p.kind, healthy !== undefined ? healthy + "/" + p.workers : p.workers,
                   p.slots, maxc ? p.inflight + " / " + maxc : p.inflight, p.queued, cost !== undefined ? "$" + fmt(cost, 2) : "-", state],
                  p.cordoned ? "cordoned" : "");
    r.dataset.pool = p.name;
    return r;
  });
  table("pools", ["pool", "kind", "workers", "slots", "in flight", "queued", "$/M tokens", "state"], rows);
}
function workerState(w) {
  if (w.drained) return ["drained" + (w.empty ? " (empty)" : "") + (w.drain_reason ? ": " + w.drain_reason : ""), "warn"];
  if (w.self_draining) return ["draining (SIGTERM)", "warn"];
  if (w.state === "cordoned") return ["pool cordoned", "warn"];
  return w.alive ? ["healthy", "ok"] : ["missing", "bad"];
}
function renderWorkers(st, m) {
  const rows = (st.workers || []).map((w) => {
    const [state, cls] = workerState(w);
    const tps = w.tokens_per_second !== undefined ? w.tokens_per_second : lookup(m, "spillway_worker_tokens_per_second", "worker", w.id);
    const r = row([w.id, w.pool, el("span", cls, state), w.inflight + "/" + w.slots, w.batch_size,
                   pct(w.kv_utilization), fmt(tps, 1), fmt((w.last_seen_ms_ago || 0) / 1000, 1) + " s"],
                  w.drained || w.self_draining ? "drained" : "");
    r.dataset.worker = w.id;
    return r;
  });
  table("workers", ["worker", "pool", "state", "in flight/slots", "batch", "KV", "tokens/s", "heartbeat"], rows);
}
function renderRoutes(st, m) {
  let routes = st.routes;
  if (!routes) {   // older status JSON: the per-route gauges, if any
    routes = (m.spillway_route_inflight || []).map((s) => ({ model: s.labels.route, inflight: s.value,
      max_concurrency: lookup(m, "spillway_route_max_concurrency", "route", s.labels.route) }));
  }
  const rows = routes.map((r) => {
    const max = r.max_concurrency || 0;
    const inf = el("span");
    inf.appendChild(bar(r.inflight || 0, max));
    inf.appendChild(document.createTextNode((r.inflight !== undefined ? r.inflight : "-") + " / " + (max || "∞")));
    return row([r.model, r.target, r.overflow ? "overflow" : "primary", inf, r.queued !== undefined ? r.queued : "-",
                r.forced_overflow ? el("span", "warn", "forced overflow" + (r.reason ? ": " + r.reason : "")) : "normal"]);
  });
  table("routes", ["model", "target", "priority", "in flight / max", "queued", "state"], rows);
}
function renderActions(st) {
  const acts = st.operator_actions;
  $("actions-section").hidden = !acts || !acts.length;
  if (!acts || !acts.length) return;
  const rows = acts.slice(-10).reverse().map((a) =>
    row([a.at_ms ? new Date(a.at_ms).toLocaleTimeString() : "-", a.action, a.target, a.by, a.reason]));
  table("actions", ["at", "action", "target", "by", "reason"], rows);
}
function renderHeader(st) {
  $("policy").textContent = "policy version " + st.policy_version;
  $("uptime").textContent = "up " + fmt(st.uptime_s, 0) + " s";
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const e = $("reload-error");
  e.hidden = !st.last_reload_error;
  e.textContent = st.last_reload_error ? "last reload failed: " + st.last_reload_error : "";
}
function renderCharts(m) {
  const ov = rateSeries(overflowByReason);
  const totals = overflowByReason(m);
  for (const s of ov) s.label = fmt(totals[s.key], 0) + " total";
  drawChart($("chart-overflow"), $("overflow-totals"), ov, "no spills");
  drawChart($("chart-ttft"), $("ttft-legend"), m.spillway_time_to_first_token_seconds_bucket ? ttftSeries() : [], "needs the TTFT histogram");
  drawChart($("chart-tps"), $("tps-legend"), tpsSeries(), "");
}

// ---- polling and the token ----
function showLogin(msg) {
  if (timer) { clearTimeout(timer); timer = null; }
  $("main").hidden = true; $("forget").hidden = true; $("login").hidden = false;
  $("login-msg").textContent = msg || "";
  $("token").focus();
}
async function poll() {
  timer = null;
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) return showLogin();
  try {
    const sr = await fetch("/admin/status", { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
    if (sr.status === 401 || sr.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      return showLogin(sr.status === 401 ? "The gateway refused that token." : "The admin API is disabled on this gateway (--admin-token-file).");
    }
    const st = await sr.json();
    const mr = await fetch("/metrics", { cache: "no-store" });
    const m = parseMetrics(mr.ok ? await mr.text() : "");
    samples.push({ t: Date.now(), m });
    if (samples.length > HISTORY + QWINDOW) samples.shift();
    $("login").hidden = true; $("main").hidden = false; $("forget").hidden = false;
    renderHeader(st); renderPools(st, m); renderWorkers(st, m); renderRoutes(st, m); renderActions(st); renderCharts(m);
  } catch (e) {
    $("updated").textContent = "gateway unreachable: " + e.message;
  }
  timer = setTimeout(poll, POLL_MS);
}
document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    if (!timer) poll();
  });
  $("forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); samples = []; showLogin(); });
  poll();
});

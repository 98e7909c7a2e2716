// Seqlog console: three pages (#/cluster, #/logs, #/logs/ID) over the node's JSON endpoints.
// No framework and nothing loaded from elsewhere; every value is put in the page as text.
"use strict";

const REFRESH_MS = 2000;
const CHART_POINTS = 60;
const RECENT_RECORDS = 20;
const PAYLOAD_PREVIEW = 120;
const EPOCH_OPEN = 4294967294;
const TRIMS_KEPT_MAX = 10000;  // logs whose trim point the logs page remembers  // a nodeset's last_epoch when it has no end yet
const state = { timer: null, page: null, history: [], lastStats: null, logsPrev: new Map(),
                logsQuery: "", logsPage: 0, token: "", trims: new Map(), trimsBusy: false,
                refreshing: false, refreshAgain: false };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// ---- credentials ------------------------------------------------------------------------
// With client authentication on (docs/SECURITY.md) every API call carries the user's bearer
// token. It comes from the sign-in form or from the URL fragment (#token=T, handy for a link
// made by `seqlog token`), and lives in sessionStorage only: it goes when the tab closes and
// is never sent anywhere but this node (the fragment never leaves the browser).

const TOKEN_KEY = "seqlog.token";

function storedToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
}

function storeToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* storage refused (private mode): the token lives in this page only */ }
  state.token = token;
}

function tokenFromFragment() {
  // "#token=T" or "#/logs/7&token=T": take the token, leave the page's route in the URL.
  const match = location.hash.match(/(^#|[&?])token=([^&]*)/);
  if (!match) return;
  storeToken(decodeURIComponent(match[2]).trim());
  const rest = location.hash.replace(match[0], match[1] === "#" ? "#" : "").replace(/^#&/, "#");
  history.replaceState(null, "", location.pathname + location.search +
                       (rest === "#" ? "#/cluster" : rest));
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function getJson(path) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const answer = await fetch(path, { headers });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    throw new ApiError(answer.status, body.status || "",
                       body.message || `${answer.status} ${answer.statusText}`);
  }
  return body;
}

function signInPage(main, error) {
  // 401: no token, or one the node refuses (bad signature, expired, revoked).
  const input = el("input", { type: "password", id: "token-input", autocomplete: "off",
                              placeholder: "bearer token", spellcheck: "false" });
  const form = el("form", { id: "token-form", class: "signin" },
    el("h1", {}, "Sign in"),
    el("p", { id: "auth-message", class: "auth-error" }, state.token
      ? `This node refused the token (401 ${error.code || "UNAUTHENTICATED"}): ${error.message}`
      : "This cluster requires a bearer token (401 UNAUTHENTICATED)."),
    el("p", { class: "muted" }, "Paste a token made by `seqlog token create` (a local " +
       "cluster's admin token is in its directory: auth/admin.token). It is kept in this " +
       "tab only."),
    input, el("button", { type: "submit", id: "token-submit" }, "Sign in"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    storeToken(input.value.trim());
    start();
  });
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
  setBanner("");
  main.replaceChildren(form);
  setStatus("signed out");
  updateSignOut();
  document.body.dataset.ready = "1";
  document.body.dataset.auth = "needed";
  input.focus();
}

function updateSignOut() {
  document.getElementById("signout").hidden = !state.token;
}

function formatLsn(lsn) {
  const big = BigInt(lsn);
  return `e${big >> 32n}n${big & 0xffffffffn}`;
}

function formatRate(value) {
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

function payloadPreview(base64) {
  const raw = atob(base64);
  const bytes = Uint8Array.from(raw, (c) => c.charCodeAt(0));
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    text = Array.from(bytes.slice(0, PAYLOAD_PREVIEW / 2),
                      (b) => b.toString(16).padStart(2, "0")).join(" ");
    return `(binary, ${bytes.length} bytes) ${text}`;
  }
  text = text.replace(/[\u0000-\u001f\u007f]/g, (c) => c === "\n" ? "\\n" : c === "\t" ? "\\t"
                      : `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
  return text.length > PAYLOAD_PREVIEW ? text.slice(0, PAYLOAD_PREVIEW) + "…" : text;
}

function setBanner(text) {
  const banner = document.getElementById("banner");
  banner.hidden = !text;
  banner.textContent = text || "";
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

function table(headers, rows, rowClass) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((cells, index) => el("tr",
      { class: rowClass ? rowClass(index) : "" },
      ...cells.map((cell) => (cell instanceof Node && cell.tagName === "TD") ? cell
                             : el("td", {}, cell))))));
}

function num(value) {
  return el("td", { class: "num" }, value);
}

function stateCell(value) {
  return el("td", {}, el("span", { class: `state state-${value}` }, value));
}

// ---- charts -------------------------------------------------------------------------

function quantile(before, after, q) {
  // Latency quantile from the difference of two cumulative bucket sets (seconds).
  const bounds = Object.keys(after).filter((le) => le !== "+Inf")
    .map(Number).sort((a, b) => a - b);
  const total = (after["+Inf"] || 0) - ((before && before["+Inf"]) || 0);
  if (total <= 0) return null;
  for (const bound of bounds) {
    const key = Object.keys(after).find((k) => Number(k) === bound);
    const count = after[key] - ((before && before[key]) || 0);
    if (count >= q * total) return bound;
  }
  return bounds.length ? bounds[bounds.length - 1] : null;
}

function pushStats(stats) {
  const last = state.lastStats;
  state.lastStats = stats;
  if (!last) return;
  const seconds = Math.max((stats.time_ms - last.time_ms) / 1000, 0.001);
  const appended = stats.appends.count - last.appends.count;
  const reads = stats.reads.count - last.reads.count;
  state.history.push({
    appendRate: Math.max(0, appended) / seconds,
    readRate: Math.max(0, reads) / seconds,
    storedRate: Math.max(0, stats.records_stored - last.records_stored) / seconds,
    readRecordsRate: Math.max(0, stats.records_read - last.records_read) / seconds,
    appendMeanMs: appended > 0 ? (stats.appends.sum_s - last.appends.sum_s) / appended * 1000
                               : null,
    appendP99Ms: (() => { const v = quantile(last.appends.buckets, stats.appends.buckets, 0.99);
                          return v === null ? null : v * 1000; })(),
    readMeanMs: reads > 0 ? (stats.reads.sum_s - last.reads.sum_s) / reads * 1000 : null,
  });
  if (state.history.length > CHART_POINTS) state.history.shift();
}

function drawChart(canvas, series) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 320;
  const height = canvas.clientHeight || 140;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const values = series.flatMap((s) => s.points.filter((v) => v !== null));
  const top = Math.max(1e-9, ...values) * 1.15;
  ctx.strokeStyle = "#e3e7ee";
  ctx.fillStyle = "#667085";
  ctx.font = "11px system-ui, sans-serif";
  for (let i = 0; i <= 2; i++) {
    const y = 8 + (height - 24) * i / 2;
    ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(width, y); ctx.stroke();
    ctx.fillText(formatRate(top * (1 - i / 2)), 2, y - 2);
  }
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let started = false;
    s.points.forEach((v, i) => {
      if (v === null) { started = false; return; }
      const x = width * i / Math.max(1, CHART_POINTS - 1);
      const y = 8 + (height - 24) * (1 - v / top);
      if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
    });
    ctx.stroke();
  }
  let x = 40;
  for (const s of series) {
    ctx.fillStyle = s.color;
    ctx.fillText(s.name, x, height - 4);
    x += ctx.measureText(s.name).width + 16;
  }
}

function chartBox(id, title) {
  return el("div", { class: "chart" },
    el("span", { class: "title" }, title), el("span", { class: "now", id: `${id}-now` }),
    el("canvas", { id }));
}

function renderCharts() {
  const h = state.history;
  const pick = (key) => h.map((p) => p[key]);
  const charts = [
    ["chart-appends", [{ name: "HTTP appends/s", color: "#2f5bd3", points: pick("appendRate") },
                       { name: "copies stored/s", color: "#1f8a4c", points: pick("storedRate") }],
     "appendRate", "/s"],
    ["chart-reads", [{ name: "HTTP reads/s", color: "#2f5bd3", points: pick("readRate") },
                     { name: "records read/s", color: "#1f8a4c",
                       points: pick("readRecordsRate") }], "readRate", "/s"],
    ["chart-latency", [{ name: "append mean ms", color: "#2f5bd3", points: pick("appendMeanMs") },
                       { name: "append p99 ms", color: "#c53030", points: pick("appendP99Ms") },
                       { name: "read mean ms", color: "#1f8a4c", points: pick("readMeanMs") }],
     "appendMeanMs", " ms"],
  ];
  for (const [id, series, key, unit] of charts) {
    const canvas = document.getElementById(id);
    if (!canvas) continue;
    drawChart(canvas, series.map((s) => ({ ...s, points: padded(s.points) })));
    const last = h.length ? h[h.length - 1][key] : null;
    document.getElementById(`${id}-now`).textContent =
      last === null || last === undefined ? "" : `now ${formatRate(last)}${unit}`;
  }
}

function padded(points) {
  return Array(Math.max(0, CHART_POINTS - points.length)).fill(null).concat(points);
}

// ---- pages ------------------------------------------------------------------------------

async function clusterPage(main) {
  const [cluster, stats] = await Promise.all([getJson("/v1/cluster"),
                                              getJson("/ui/api/cluster-stats")]);
  pushStats(stats);
  const counts = { ALIVE: 0, SUSPECT: 0, DEAD: 0 };
  for (const n of cluster.nodes) counts[n.state] += 1;
  const dead = cluster.nodes.filter((n) => n.state !== "ALIVE").map((n) => `${n.node_id} ${n.state}`);
  setBanner(dead.length ? `Not every node is ALIVE: ${dead.join(", ")}` +
            (stats.unreachable.length ? `; not answering: ${stats.unreachable.join(", ")}` : "")
            : (stats.unreachable.length ? `Not answering: ${stats.unreachable.join(", ")}` : ""));
  main.replaceChildren(
    el("h1", {}, `Cluster ${cluster.cluster}`),
    el("div", { class: "cards" },
      ...["ALIVE", "SUSPECT", "DEAD"].map((s) => el("div", { class: "card", id: `count-${s}` },
        el("div", { class: "label" }, `${s} nodes`),
        el("div", { class: `value state-${s}` }, counts[s]))),
      el("div", { class: "card" }, el("div", { class: "label" }, "protocol"),
        el("div", { class: "value" }, cluster.protocol_version))),
    el("h2", {}, "Nodes"),
    table(["node", "state", "roles", "http", "data", "sequencer weight", "storage capacity"],
      cluster.nodes.map((n) => [n.node_id, stateCell(n.state), n.roles.join(", "), n.http,
                                n.data, num(n.sequencer_weight), num(n.storage_capacity)])),
    el("h2", {}, "Live (all nodes that answer)"),
    el("div", { class: "charts" }, chartBox("chart-appends", "Appends"),
       chartBox("chart-reads", "Reads"), chartBox("chart-latency", "Latency")));
  main.querySelector("table").id = "nodes";
  renderCharts();
}

async function logsPage(main) {
  const query = state.logsQuery;
  const answer = await getJson(`/ui/api/logs?q=${encodeURIComponent(query)}` +
                               `&page=${state.logsPage}&page_size=50`);
  const now = Date.now();
  fetchTrims(answer.logs.map((row) => row.log_id));
  const missing = answer.unreachable.concat(answer.dead.map((n) => `${n} (DEAD)`));
  setBanner(missing.length ? `Partial list: no answer from ${missing.join(", ")}` : "");
  const rows = answer.logs.map((row, i) => {
    const previous = state.logsPrev.get(row.log_id);
    let rate = "…";
    if (previous) {
      const seconds = (now - previous.at) / 1000;
      const sameEpoch = previous.epoch === row.epoch;
      const appended = sameEpoch ? row.next_lsn - previous.next_lsn
                                 : Number(BigInt(row.next_lsn) & 0xffffffffn) - 1;
      rate = formatRate(Math.max(0, appended) / Math.max(seconds, 0.001));
    }
    state.logsPrev.set(row.log_id, { at: now, next_lsn: row.next_lsn, epoch: row.epoch });
    const trim = state.trims.get(row.log_id);
    return [el("td", {}, el("a", { href: `#/logs/${row.log_id}` }, row.log_id)),
            row.sequencer, stateCell(row.state + (row.recovering ? " (recovering)" : "")),
            num(row.epoch), num(formatLsn(row.release_lsn)),
            el("td", { class: "num", "data-trim": row.log_id }, trimText(trim)), num(rate),
            num(Math.max(0, row.next_lsn - 1 - row.release_lsn)), num(row.appends_in_flight),
            num(row.idle_ms === null ? "never" : `${(row.idle_ms / 1000).toFixed(1)} s ago`)];
  });
  const pages = Math.max(1, Math.ceil(answer.total / answer.page_size));
  const search = el("input", { type: "search", id: "log-search", placeholder: "log id contains…",
                               value: query });
  search.addEventListener("input", () => {
    state.logsQuery = search.value.trim();
    state.logsPage = 0;
    refresh();
  });
  main.replaceChildren(
    el("h1", {}, "Logs"),
    el("div", { class: "toolbar" }, search,
      el("button", { id: "prev", onclick: () => { state.logsPage -= 1; refresh(); } }, "‹ prev"),
      el("span", { id: "page-info", class: "muted" },
         `page ${answer.page + 1} of ${pages} · ${answer.total} active logs`),
      el("button", { id: "next", onclick: () => { state.logsPage += 1; refresh(); } }, "next ›")),
    table(["log", "sequencer", "state", "epoch", "release", "trim", "appends/s", "release lag",
           "in flight", "last append"], rows));
  main.querySelector("table").id = "logs";
  main.querySelector("#prev").disabled = answer.page === 0;
  main.querySelector("#next").disabled = answer.page + 1 >= pages;
  const active = document.activeElement;
  if (!active || active === document.body) search.focus();
  if (query) { search.focus(); search.setSelectionRange(query.length, query.length); }
}

// A log's trim point is not in the logs list: each row's comes from its /tail, fetched in the
// background and kept (trim points rarely move), so that the table never waits for them. A
// recovering log's /tail can take seconds (it waits while NOTREADY), and a browser asks one
// node at most six things at once: 50 rows could hold the page for many seconds.
function trimText(trim) {
  return trim === undefined ? "…" : trim === null ? "?" : formatLsn(trim);
}

function fetchTrims(logIds) {
  if (state.trimsBusy) return;
  state.trimsBusy = true;
  if (state.trims.size > TRIMS_KEPT_MAX) state.trims.clear();
  Promise.all(logIds.map((logId) => getJson(`/v1/logs/${logId}/tail`)
    .then((tail) => state.trims.set(logId, tail.trim_lsn))
    .catch(() => state.trims.set(logId, null))
    .then(() => {
      const cell = document.querySelector(`td[data-trim="${logId}"]`);
      if (cell) cell.textContent = trimText(state.trims.get(logId));
    })))
    .finally(() => { state.trimsBusy = false; });
}

async function logPage(main, logId) {
  let tail;
  try {
    tail = await getJson(`/v1/logs/${logId}/tail`);
  } catch (error) {
    if (error.status === 404) {
      main.replaceChildren(el("h1", {}, `Log ${logId}`),
                           el("p", { class: "muted" }, "This log has never been written."));
      return;
    }
    throw error;
  }
  // The last records of the release point's epoch (reads go forward only).
  const release = BigInt(tail.release_lsn);
  const epochStart = ((release >> 32n) << 32n) + 1n;
  let start = release - BigInt(RECENT_RECORDS) + 1n;
  if (start < epochStart) start = epochStart;
  if (start <= BigInt(tail.trim_lsn)) start = BigInt(tail.trim_lsn) + 1n;
  const from = Number(start);
  const [page, nodesets] = await Promise.all([
    getJson(`/v1/logs/${logId}/records?from=${from}&limit=${RECENT_RECORDS}`),
    getJson(`/v1/logs/${logId}/nodesets`)]);
  setBanner("");
  const entries = page.records.map((r) => ({ kind: "record", lo: r.lsn, r }))
    .concat(page.gaps.map((g) => ({ kind: "gap", lo: g.lo, g })))
    .sort((a, b) => (BigInt(a.lo) < BigInt(b.lo) ? -1 : 1));
  const rows = entries.map((e) => e.kind === "record"
    ? [num(formatLsn(e.r.lsn)), num(e.r.lsn), new Date(e.r.timestamp_ms).toISOString(),
       e.r.key === null ? "-" : e.r.key, el("td", { class: "payload" }, payloadPreview(e.r.payload))]
    : [num(`${formatLsn(e.g.lo)}..${formatLsn(e.g.hi)}`), num(`${e.g.lo}..${e.g.hi}`), "-", "-",
       `${e.g.type} gap`]);
  main.replaceChildren(
    el("h1", {}, `Log ${logId}`),
    el("div", { class: "cards" },
      ...[["sequencer", tail.sequencer || "-"], ["epoch", tail.epoch],
          ["release", formatLsn(tail.release_lsn)], ["trim", formatLsn(tail.trim_lsn)]]
        .map(([label, value]) => el("div", { class: "card", id: `card-${label}` },
          el("div", { class: "label" }, label), el("div", { class: "value" }, value)))),
    el("h2", {}, `Recent records (up to ${RECENT_RECORDS}, from ${formatLsn(from)})`),
    table(["lsn", "lsn (integer)", "time (UTC)", "key", "payload"], rows,
          (i) => entries[i].kind === "gap" ? "gap" : ""),
    el("h2", {}, "Epochs (epoch store metadata)"),
    table(["epochs", "replication", "storage nodes"],
      nodesets.nodesets.map((n) => [n.last_epoch >= EPOCH_OPEN ? `${n.first_epoch}..`
                                    : `${n.first_epoch}..${n.last_epoch}`, num(n.replication_factor),
                                    n.nodes.map((x) => x.node_id).join(", ")])));
  main.querySelectorAll("table")[0].id = "records";
  main.querySelectorAll("table")[1].id = "epochs";
}

// ---- routing ----------------------------------------------------------------------------

function route() {
  const hash = location.hash || "#/cluster";
  const match = hash.match(/^#\/logs\/(\d+)$/);
  if (match) return { name: "log", logId: match[1] };
  return { name: hash.startsWith("#/logs") ? "logs" : "cluster" };
}

async function refresh() {
  // One refresh at a time: a slow answer must not pile the timer's refreshes up behind it; a
  // refresh asked for meanwhile (a search, a page) runs when the current one ends.
  if (state.refreshing) {
    state.refreshAgain = true;
    return;
  }
  state.refreshing = true;
  try {
    await refreshNow();
  } finally {
    state.refreshing = false;
    if (state.refreshAgain) {
      state.refreshAgain = false;
      refresh();
    }
  }
}

async function refreshNow() {
  const main = document.getElementById("main");
  const current = route();
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === (current.name === "log" ? "logs"
                                                                                : current.name));
  }
  try {
    if (current.name === "cluster") await clusterPage(main);
    else if (current.name === "logs") await logsPage(main);
    else await logPage(main, current.logId);
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
    document.body.dataset.ready = "1";
    document.body.dataset.auth = state.token ? "token" : "open";
  } catch (error) {
    if (error.status === 401) {
      signInPage(main, error);
    } else if (error.status === 403) {
      // A valid token whose principal lacks a grant this page needs: say which, keep the token.
      setBanner(`Access denied (403 ${error.code || "ACCESS"}): ${error.message}`);
      setStatus("access denied");
      document.body.dataset.ready = "1";
    } else {
      setBanner(`This node could not answer: ${error.message}`);
      setStatus("stale");
    }
  }
}

function start() {
  if (state.timer) clearInterval(state.timer);
  state.timer = setInterval(refresh, REFRESH_MS);
  updateSignOut();
  refresh();
}

window.addEventListener("hashchange", () => {
  tokenFromFragment();
  document.body.dataset.ready = "";
  start();
});
document.getElementById("signout").addEventListener("click", () => {
  storeToken("");
  document.body.dataset.ready = "";
  start();
});
state.token = storedToken();
tokenFromFragment();
start();

// turnpool dashboard: one script, no build step, no dependency. It polls the JSON API while the tab
// is visible (nothing at all while it is hidden) and follows one turn's events over Server-Sent
// Events (read with fetch, so a bearer token can go along). Lists are paged and filtered by the
// daemon (GET /v1/live, /v1/history): the page never holds more than one page of each. Everything
// shown comes from the daemon as data and is put into the page with textContent, never as HTML.
// Times are ISO 8601 UTC, as the CLI writes them; the local time is in each one's title.
"use strict";

const OUTCOMES = ["completed", "failed", "aborted", "killed", "crashed"];
const POLL_MS = 1000;
const SLOW_POLL_MS = 5000; // per-agent figures, the worker log, the header away from the overview
const CHART_SECONDS = 300;
const MAX_EVENT_LINES = 500;
const PAGE = { running: 25, queued: 25, history: 50 }; // rows per page of each list
const RECENT = 20;

const state = {
  token: sessionStorage.getItem("turnpool-token") || "",
  timer: null,
  slowTimer: null,
  clockOffset: 0, // server now - local now, seconds
  follow: null, // {turnId, lastId, ctrl, count, ended}
  page: "overview",
  offsets: { running: 0, queued: 0, history: 0 },
  totals: { running: 0, queued: 0, history: 0 },
  window: "5m",
  agents: null,
  size: null, // {workers, spares} as configured
};

// ---- helpers ------------------------------------------------------------------------------

function $(id) { return document.getElementById(id); }

// An id as one path segment (LINK-TURN-ID): percent-encoded, and an id of dots only as %2E so that the
// browser does not take "." or ".." for a step of the path.
function seg(id) {
  return /^\.+$/.test(id) ? "%2E".repeat(id.length) : encodeURIComponent(id);
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function serverNow() { return Date.now() / 1000 + state.clockOffset; }

// One time format everywhere: ISO 8601 UTC to the second (as `turnpool history` prints).
function iso(epoch) {
  if (epoch == null || !isFinite(epoch)) return "–";
  return new Date(epoch * 1000).toISOString().replace(/\.\d+Z$/, "Z");
}

// A time cell or span: ISO UTC shown, local time on hover.
function timeEl(tag, epoch, props) {
  const node = el(tag, Object.assign({ class: "time", text: iso(epoch) }, props || {}));
  if (epoch != null && isFinite(epoch)) node.title = new Date(epoch * 1000).toLocaleString() + " (local)";
  return node;
}

function fmtAge(seconds) {
  if (seconds == null || !isFinite(seconds)) return "–";
  seconds = Math.max(0, seconds);
  if (seconds < 60) return seconds.toFixed(1) + " s";
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + " m " + Math.floor(seconds % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function fmtSeconds(s) {
  if (s == null) return "–";
  if (s < 0.001) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms";
  return fmtAge(s);
}

function turnLink(turnId) {
  return el("a", { href: "#/turn/" + encodeURIComponent(turnId), text: turnId });
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const res = await fetch(path, opts);
  if (res.status === 401) {
    askToken();
    throw new Error("unauthorized");
  }
  const body = await res.json().catch(() => null);
  if (!res.ok && res.status !== 202) {
    const msg = body && body.error ? body.error.message : res.statusText;
    const err = new Error(res.status + " " + msg);
    err.status = res.status;
    throw err;
  }
  return { status: res.status, body };
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) q.set(k, v);
  return q.toString();
}

function askToken() {
  const t = window.prompt("This turnpool daemon needs its API token (kept for this tab only):", "");
  if (t) {
    state.token = t.trim();
    sessionStorage.setItem("turnpool-token", state.token);
  }
}

function setLink(ok, note) {
  $("link").classList.toggle("down", !ok);
  $("link").title = ok ? "connected" : ("not connected: " + (note || ""));
}

function emptyRow(cols, text) {
  return el("tr", {}, el("td", { class: "empty", colSpan: cols, text }));
}

// "1–50 of 998" with previous / next buttons; `which` names the list in state.offsets.
function renderPager(which, total, shown) {
  const pager = $(which + "-pager");
  const offset = state.offsets[which];
  state.totals[which] = total;
  const text = total ? `${offset + 1}–${offset + shown} of ${total}` : "none";
  pager.replaceChildren(
    el("button", { class: "prev", text: "‹ previous", disabled: offset <= 0,
      onclick: () => movePage(which, -PAGE[which]) }),
    el("span", { class: "range", text }),
    el("button", { class: "next", text: "next ›", disabled: offset + shown >= total,
      onclick: () => movePage(which, PAGE[which]) }));
}

function movePage(which, delta) {
  const size = PAGE[which];
  const last = Math.max(0, Math.floor((state.totals[which] - 1) / size) * size);
  state.offsets[which] = Math.min(last, Math.max(0, state.offsets[which] + delta));
  if (which === "history") loadHistory(); else poll();
}

function liveFilters() {
  return { agent: $("f-agent").value.trim(), session: $("f-session").value.trim(),
    id: $("f-id").value.trim(), q: $("f-q").value.trim() };
}

// ---- header (every page) ------------------------------------------------------------------

function renderStatus(st) {
  const d = st.daemon || {};
  $("daemon").textContent = `pid ${d.pid ?? st.pid} · ${d.endpoint ?? ""} · ${st.state}` +
    (d.accepting === false ? " · not accepting (draining)" : "");
  state.size = st.size || null;
}

async function pollHeader() {
  try {
    const st = await api("/v1/status");
    renderStatus(st.body);
    setLink(true);
    return st.body;
  } catch (err) {
    setLink(false, err.message);
    return null;
  }
}

// ---- overview -----------------------------------------------------------------------------

async function poll() {
  if (document.hidden || state.page !== "overview") return;
  const f = liveFilters();
  const outcome = $("f-outcome").value;
  try {
    const [st, running, queued, recent, series] = await Promise.all([
      api("/v1/status"),
      api("/v1/live?" + query(Object.assign({ state: "running", offset: state.offsets.running, limit: PAGE.running }, f))),
      api("/v1/live?" + query(Object.assign({ state: "queued", offset: state.offsets.queued, limit: PAGE.queued }, f))),
      api("/v1/live?" + query(Object.assign({ state: "ended", limit: RECENT, outcome }, f))),
      api("/v1/outcomes?seconds=" + CHART_SECONDS),
    ]);
    state.clockOffset = running.body.now - Date.now() / 1000;
    renderStatus(st.body);
    renderCards(st.body);
    renderWorkers(st.body);
    renderRunning(running.body);
    renderQueued(queued.body);
    renderRecent(recent.body.turns);
    renderChart(series.body);
    setLink(true);
  } catch (err) {
    setLink(false, err.message);
  }
}

function renderCards(st) {
  $("queue").textContent = st.queue;
  $("running-count").textContent = st.running;
  const workers = st.workers || [];
  const size = st.size || { workers: workers.length, spares: 0 };
  const busy = workers.filter(w => w.state === "busy").length;
  $("busy").textContent = `${busy} / ${size.workers}`;
  $("spares").textContent = `${roles(workers, size).filter(r => r === "spare").length} / ${size.spares}`;
  const totals = st.outcomes || {};
  $("totals").replaceChildren(...OUTCOMES.map(o =>
    el("span", { class: "outcome-" + o, text: `${o} ${totals[o] || 0}   ` })));
}

// The pool runs `workers` turns at once and keeps `spares` more warm: an idle worker beyond the
// ones free for turns is a spare (it takes over the queued turn of a worker that is killed).
function roles(workers, size) {
  let freeWorkers = Math.max(0, size.workers - workers.filter(w => w.state === "busy").length);
  return workers.map(w => {
    if (w.state === "busy") return "worker";
    if (w.state === "idle") {
      if (freeWorkers > 0) { freeWorkers--; return "worker"; }
      return "spare";
    }
    return "–";
  });
}

function renderWorkers(st) {
  const workers = st.workers || [];
  const size = st.size || { workers: workers.length, spares: 0 };
  const role = roles(workers, size);
  $("workers-hint").textContent = `${size.workers} worker(s) run turns; ${size.spares} warm spare(s) stand by`;
  const body = $("workers").tBodies[0];
  body.replaceChildren(...workers.map((w, i) => el("tr", { "data-worker": w.id, "data-role": role[i] },
    el("td", { text: w.id }), el("td", { text: w.pid }),
    el("td", { class: "role-" + role[i], text: role[i] }),
    el("td", { class: "state-" + w.state, text: w.state }),
    el("td", {}, w.turn_id ? turnLink(w.turn_id) : "–"),
    el("td", { class: "num", text: (w.rss_mb ?? 0).toFixed(1) }),
    el("td", { class: "num", text: w.turns_run }))));
  if (!workers.length) body.append(emptyRow(7, "no worker"));
}

function cancellationCell(t) {
  if (!t.cause) return el("span", { text: "–" });
  const step = t.escalation || "abort";
  const text = `${t.cause.kind}: ${step === "abort" ? "Abort sent" : step.toUpperCase() + " sent"}`;
  const cell = el("span", { class: "esc " + step, "data-step": step, text });
  if (t.next_signal && t.next_signal_at) {
    cell.append(el("span", { class: "countdown", "data-at": t.next_signal_at,
      "data-signal": t.next_signal, text: "" }));
  }
  return cell;
}

function actionsCell(t) {
  return el("td", { class: "actions-cell" },
    el("button", { class: "danger cancel-turn", text: "cancel", disabled: !!t.cause,
      onclick: () => cancelTurn(t.turn_id) }),
    t.session ? " " : "",
    t.session ? el("button", { class: "danger cancel-session", text: "cancel session",
      onclick: () => cancelSession(t.session) }) : "");
}

function renderRunning(page) {
  const now = serverNow();
  const rows = page.turns.map(t => el("tr", { "data-turn": t.turn_id, "data-state": t.state },
    el("td", {}, turnLink(t.turn_id)),
    el("td", { text: t.agent }),
    el("td", { text: t.session || "–" }),
    el("td", { class: "num", text: t.worker_pid ?? "–" }),
    timeEl("td", t.started_at),
    el("td", { class: "age", "data-since": t.started_at || t.submitted_at, text: fmtAge(now - (t.started_at || t.submitted_at)) }),
    el("td", { class: "num", text: t.events }),
    el("td", {}, cancellationCell(t)),
    actionsCell(t)));
  if (!rows.length) rows.push(emptyRow(9, "nothing running"));
  $("running").tBodies[0].replaceChildren(...rows);
  $("running-total").textContent = `${page.total} turn(s)`;
  renderPager("running", page.total, page.turns.length);
  tick();
}

function renderQueued(page) {
  const now = serverNow();
  const rows = page.turns.map(t => el("tr", { "data-turn": t.turn_id, "data-state": t.state },
    el("td", {}, turnLink(t.turn_id)),
    el("td", { text: t.agent }),
    el("td", { text: t.session || "–" }),
    timeEl("td", t.submitted_at),
    el("td", { class: "age", "data-since": t.submitted_at, text: fmtAge(now - t.submitted_at) }),
    el("td", {}, cancellationCell(t)),
    actionsCell(t)));
  if (!rows.length) rows.push(emptyRow(7, "nothing queued"));
  $("queued").tBodies[0].replaceChildren(...rows);
  $("queued-total").textContent = `${page.total} turn(s)`;
  renderPager("queued", page.total, page.turns.length);
}

// Ages and countdowns move every quarter second from the last poll, without asking the server.
function tick() {
  const now = serverNow();
  for (const td of document.querySelectorAll("td.age")) td.textContent = fmtAge(now - parseFloat(td.dataset.since));
  for (const c of document.querySelectorAll(".countdown")) {
    const left = parseFloat(c.dataset.at) - now;
    c.textContent = ` · ${c.dataset.signal.toUpperCase()} in ${Math.max(0, left).toFixed(1)} s`;
  }
  $("clock").textContent = iso(now);
}

// A failed turn's error, or a killed turn's cause and the signal that ended it.
function whyCell(t) {
  if (t.error) return el("td", { class: "why error", title: `${t.error.type}: ${t.error.message}`,
    text: `${t.error.type}: ${t.error.message}` });
  if (t.kill_reason) return el("td", { class: "why kill", text: t.kill_reason });
  const cause = t.cause && typeof t.cause === "object" ? t.cause.kind : t.cause;
  return el("td", { class: "why", text: cause ? `cause ${cause}` : "–" });
}

function renderRecent(turns) {
  const rows = turns.map(t => el("tr", { "data-turn": t.turn_id, "data-outcome": t.outcome || "" },
    el("td", {}, turnLink(t.turn_id)),
    el("td", { text: t.agent }),
    el("td", { class: "outcome-" + t.outcome, text: t.outcome || "–" }),
    whyCell(t),
    el("td", { class: "num", text: t.started_at && t.ended_at ? (t.ended_at - t.started_at).toFixed(3) : "–" }),
    timeEl("td", t.ended_at)));
  if (!rows.length) rows.push(emptyRow(6, "no turn ended yet"));
  $("recent").tBodies[0].replaceChildren(...rows);
}

function renderChart(series) {
  const chart = $("chart");
  const n = CHART_SECONDS;
  const W = 600, H = 120, top = 12, bottom = 14;
  const totals = new Array(n).fill(0);
  for (const o of OUTCOMES) (series.outcomes[o] || []).forEach((v, i) => { totals[i] += v; });
  const peak = Math.max(1, ...totals);
  const bw = W / n;
  const nodes = [];
  for (let i = 0; i < n; i++) {
    let y = H - bottom;
    for (const o of OUTCOMES) {
      const v = (series.outcomes[o] || [])[i] || 0;
      if (!v) continue;
      const h = (v / peak) * (H - top - bottom);
      y -= h;
      nodes.push(svg("rect", { x: (i * bw).toFixed(2), y: y.toFixed(2), width: Math.max(bw - 0.3, 0.5).toFixed(2),
        height: h.toFixed(2), class: "fill-" + o }));
    }
  }
  nodes.push(svg("line", { x1: 0, y1: H - bottom, x2: W, y2: H - bottom, class: "axis" }));
  const label = (x, y, text, anchor) => {
    const t = svg("text", { x, y, "text-anchor": anchor || "start" });
    t.textContent = text;
    return t;
  };
  nodes.push(label(2, 9, `peak ${peak}/s`));
  nodes.push(label(2, H - 3, `-${n / 60} min`));
  nodes.push(label(W - 2, H - 3, "now", "end"));
  chart.replaceChildren(...nodes);
  const last10 = totals.slice(-11, -1).reduce((a, b) => a + b, 0) / 10;
  $("rate").textContent = last10.toFixed(last10 < 10 ? 1 : 0);
  $("legend").replaceChildren(...OUTCOMES.map(o => el("span", {},
    el("span", { class: "swatch bg-" + o }), `${o} ${(series.outcomes[o] || []).reduce((a, b) => a + b, 0)}`)));
}

async function pollAgents() {
  if (document.hidden || state.page !== "overview") return;
  try {
    state.agents = (await api("/v1/agents")).body;
    renderAgents();
  } catch (err) {
    setLink(false, err.message);
  }
}

function renderAgents() {
  const figures = state.agents ? state.agents.windows[state.window] || {} : {};
  const rows = Object.entries(figures).map(([agent, a]) => el("tr", { "data-agent": agent },
    el("td", { text: agent }),
    el("td", { class: "num", text: a.turns }),
    ...OUTCOMES.map(o => el("td", { class: "num" + (a.outcomes[o] && o !== "completed" ? " outcome-" + o : ""),
      text: a.outcomes[o] || 0 })),
    el("td", { class: "num", text: fmtSeconds(a.queue_p50) }),
    el("td", { class: "num", text: fmtSeconds(a.queue_p99) }),
    el("td", { class: "num", text: fmtSeconds(a.run_p50) }),
    el("td", { class: "num", text: fmtSeconds(a.run_p99) })));
  if (!rows.length) rows.push(emptyRow(11, "no turn ended in this window"));
  $("agents").tBodies[0].replaceChildren(...rows);
  for (const b of document.querySelectorAll("button.tab")) b.classList.toggle("on", b.dataset.window === state.window);
}

async function cancelTurn(turnId) {
  if (!window.confirm(`Cancel turn ${turnId}? Its agent gets an Abort; after the grace period its worker is killed.`)) return;
  try {
    await api("/v1/turns/" + seg(turnId) + "/cancel", { method: "POST" });
  } catch (err) {
    window.alert("cancel failed: " + err.message);
  }
  poll();
  if (state.page === "turn") loadTurn(turnId, false);
}

async function cancelSession(session) {
  if (!window.confirm(`Cancel session ${session}? Its running turn and the turns queued now are cancelled.`)) return;
  try {
    const r = await api("/v1/sessions/" + seg(session) + "/cancel", { method: "POST" });
    $("footer-note").textContent = `session ${session}: cancelled ${r.body.cancelled.length} turn(s)`;
  } catch (err) {
    window.alert("cancel failed: " + err.message);
  }
  poll();
}

// ---- history (the journal) ----------------------------------------------------------------

async function loadHistory() {
  if (document.hidden || state.page !== "history") return;
  const params = { offset: state.offsets.history, limit: PAGE.history, agent: $("h-agent").value.trim(),
    session: $("h-session").value.trim(), outcome: $("h-outcome").value, q: $("h-q").value.trim() };
  let page;
  try {
    page = (await api("/v1/history?" + query(params))).body;
    setLink(true);
  } catch (err) {
    $("history-source").textContent = err.message;
    return;
  }
  $("history-source").textContent = page.source === "journal"
    ? `${page.total} turn(s) in the journal` : `${page.total} ended turn(s) kept in memory (no journal)`;
  const rows = page.turns.map(t => el("tr", { "data-turn": t.turn_id, "data-outcome": t.outcome || "" },
    el("td", {}, turnLink(t.turn_id)),
    el("td", { text: t.agent }),
    el("td", { text: t.session || "–" }),
    el("td", { text: t.state }),
    el("td", { class: "outcome-" + t.outcome, text: t.outcome || "–" }),
    whyCell(t),
    timeEl("td", t.submitted_at),
    timeEl("td", t.ended_at),
    el("td", { class: "num", text: t.started_at && t.ended_at ? (t.ended_at - t.started_at).toFixed(3) : "–" }),
    el("td", { class: "num", text: t.worker_pid ?? "–" })));
  if (!rows.length) rows.push(emptyRow(10, "no turn matches"));
  $("history").tBodies[0].replaceChildren(...rows);
  renderPager("history", page.total, page.turns.length);
}

// ---- worker log ---------------------------------------------------------------------------

async function loadLog() {
  if (document.hidden || state.page !== "log") return;
  try {
    const tail = (await api("/v1/worker-log?lines=300")).body;
    const pre = $("log-lines");
    if (tail.path) {
      $("log-where").textContent = `last ${tail.lines.length} line(s) of ${tail.path}` + (tail.truncated ? " (earlier lines in the file)" : "");
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = tail.lines.join("\n") || "(empty)";
      if (stick) pre.scrollTop = pre.scrollHeight;
    } else {
      $("log-where").textContent = "";
      pre.textContent = {
        stderr: "Workers' output goes to the daemon's stderr (serve --worker-log stderr): nothing to show here.",
        inherit: "Workers' output goes to the daemon's own stdout and stderr: nothing to show here.",
        discarded: "Workers' output is discarded (serve --worker-log none).",
      }[tail.output] || `Workers' output goes to ${tail.output}, which holds nothing yet.`;
    }
    setLink(true);
  } catch (err) {
    setLink(false, err.message);
  }
}

// ---- one turn -----------------------------------------------------------------------------

function fact(k, v) { return [el("dt", { text: k }), v instanceof Node ? el("dd", {}, v) : el("dd", { text: v })]; }

async function loadTurn(turnId, fresh) {
  let view;
  try {
    view = (await api("/v1/turns/" + seg(turnId) + "/state")).body;
  } catch (err) {
    if (err.status === 404) return loadEndedTurn(turnId);
    $("turn-state").textContent = err.message;
    return;
  }
  $("turn-id").textContent = turnId;
  $("turn-state").textContent = view.outcome || view.state;
  $("turn-state").className = "badge outcome-" + (view.outcome || "");
  const facts = [["agent", view.agent], ["session", view.session || "–"], ["state", view.state],
    ["worker pid", view.worker_pid ?? "–"], ["events", view.events],
    ["cause", view.cause ? view.cause.kind : "–"], ["escalation", view.escalation || "–"],
    ["submitted", timeEl("span", view.submitted_at)], ["started", timeEl("span", view.started_at)],
    ["ended", timeEl("span", view.ended_at)]];
  $("turn-facts").replaceChildren(...facts.flatMap(([k, v]) => fact(k, v)));
  if (fresh) {
    $("turn-input").textContent = view.input_retained ? JSON.stringify(view.input, null, 2)
      : "(the daemon no longer keeps this turn's input)";
  }
  const live = view.state !== "ended";
  $("turn-cancel").hidden = !live;
  $("turn-cancel").disabled = !!view.cause;
  $("turn-cancel").onclick = () => cancelTurn(turnId);
  $("turn-cancel-session").hidden = !(live && view.session);
  $("turn-cancel-session").onclick = () => cancelSession(view.session);
}

// A turn the daemon no longer keeps: its result and kept events from the journal.
async function loadEndedTurn(turnId) {
  stopFollow();
  if (state.follow) state.follow.ended = true;
  let found;
  try {
    found = (await api("/v1/history/" + encodeURIComponent(turnId))).body;
  } catch (err) {
    $("turn-id").textContent = turnId;
    $("turn-state").textContent = err.status === 404 ? "unknown turn" : err.message;
    $("turn-result").textContent = "(neither the daemon nor its journal knows this turn)";
    return;
  }
  const r = found.result;
  $("turn-id").textContent = turnId;
  $("turn-state").textContent = r ? r.outcome : "not ended";
  $("turn-state").className = "badge outcome-" + (r ? r.outcome : "");
  $("turn-cancel").hidden = true;
  $("turn-cancel-session").hidden = true;
  if (r) {
    const facts = [["agent", r.agent], ["session", r.session || "–"], ["state", "ended (from the journal)"],
      ["worker pid", r.worker_pid ?? "–"], ["cause", r.cause ? r.cause.kind : "–"],
      ["kill reason", found.kill_reason || "–"],
      ["error", r.error ? `${r.error.type}: ${r.error.message}` : "–"], ["attempts", r.attempts],
      ["submitted", timeEl("span", r.submitted_at)], ["started", timeEl("span", r.started_at)],
      ["ended", timeEl("span", r.ended_at)], ["queued", fmtSeconds(r.queued_s)], ["ran", fmtSeconds(r.run_s)]];
    $("turn-facts").replaceChildren(...facts.flatMap(([k, v]) => fact(k, v)));
    $("turn-result").textContent = JSON.stringify(r, null, 2);
    $("turn-result").dataset.outcome = r.outcome;
  }
  $("turn-input").textContent = "(the journal's input is not shown)";
  $("turn-events").replaceChildren(...found.events.map((e, i) =>
    el("div", { class: "event", "data-seq": i }, el("span", { class: "seq", text: i }), JSON.stringify(e))));
  $("turn-events-count").textContent = found.events.length ? `${found.events.length} kept by the journal`
    : "none kept (serve --journal-events keeps them)";
}

function stopFollow() {
  if (state.follow && state.follow.ctrl) state.follow.ctrl.abort();
  if (state.follow) state.follow.ctrl = null;
}

function appendEvents(lines) {
  const log = $("turn-events");
  const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.append(...lines);
  while (log.childElementCount > MAX_EVENT_LINES) log.firstElementChild.remove();
  if (stick) log.scrollTop = log.scrollHeight;
}

async function follow() {
  const f = state.follow;
  if (!f || f.ctrl || f.ended || document.hidden) return;
  f.ctrl = new AbortController();
  const h = headers({ Accept: "text/event-stream" });
  if (f.lastId >= 0) h["Last-Event-ID"] = String(f.lastId);
  let pending = [];
  let scheduled = false;
  const flush = () => { scheduled = false; appendEvents(pending); pending = []; $("turn-events-count").textContent = `${f.count} received`; };
  try {
    const res = await fetch("/v1/turns/" + seg(f.turnId) + "/events", { headers: h, signal: f.ctrl.signal });
    if (res.status === 401) { askToken(); throw new Error("unauthorized"); }
    if (res.status === 404) { f.ended = true; return; } // no longer kept: loadTurn reads the journal
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const msg = { event: "message", data: "", id: null };
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const i = line.indexOf(":");
          const key = i < 0 ? line : line.slice(0, i);
          const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
          if (key === "event") msg.event = val;
          else if (key === "data") msg.data += (msg.data ? "\n" : "") + val;
          else if (key === "id") msg.id = val;
        }
        if (msg.event === "event") {
          f.lastId = parseInt(msg.id, 10);
          f.count++;
          pending.push(el("div", { class: "event", "data-seq": msg.id }, el("span", { class: "seq", text: msg.id }), msg.data));
        } else if (msg.event === "gap") {
          const g = JSON.parse(msg.data);
          pending.push(el("div", { class: "gap", text: `… events ${g.from}–${g.to} are no longer kept by the daemon` }));
        } else if (msg.event === "end") {
          const result = JSON.parse(msg.data);
          f.ended = true;
          $("turn-result").textContent = JSON.stringify(result, null, 2);
          $("turn-result").dataset.outcome = result.outcome;
          loadTurn(f.turnId, false);
        }
        if (pending.length && !scheduled) { scheduled = true; requestAnimationFrame(flush); }
      }
    }
  } catch (err) {
    if (err.name !== "AbortError") $("turn-events-count").textContent = "stream interrupted: " + err.message;
  } finally {
    if (pending.length) flush();
    if (f.ctrl) f.ctrl = null;
  }
  // The stream ended without an `end` (daemon restarting, network): try again while visible.
  if (!f.ended && state.follow === f && !document.hidden) setTimeout(follow, 2000);
}

function openTurn(turnId) {
  stopFollow();
  state.follow = { turnId, lastId: -1, ctrl: null, count: 0, ended: false };
  $("turn-events").replaceChildren();
  $("turn-result").textContent = "(running)";
  delete $("turn-result").dataset.outcome;
  $("turn-events-count").textContent = "";
  $("turn-facts").replaceChildren();
  loadTurn(turnId, true).then(() => { if (state.follow && !state.follow.ended) follow(); });
}

// ---- routing and visibility ---------------------------------------------------------------

const PAGES = { overview: "overview", history: "history-page", log: "log-page", turn: "turn-page" };

function show(page) {
  state.page = page;
  for (const [name, id] of Object.entries(PAGES)) $(id).hidden = name !== page;
  for (const name of ["overview", "history", "log"]) $("nav-" + name).classList.toggle("on", name === page);
}

function route() {
  const m = location.hash.match(/^#\/turn\/(.+)$/);
  if (m) {
    show("turn");
    const turnId = decodeURIComponent(m[1]);
    if (!state.follow || state.follow.turnId !== turnId) openTurn(turnId);
    pollHeader(); // a deep link fills the header at once, not only from the overview
    return;
  }
  stopFollow();
  state.follow = null;
  if (location.hash === "#/history") {
    show("history");
    pollHeader();
    loadHistory();
  } else if (location.hash === "#/log") {
    show("log");
    pollHeader();
    loadLog();
  } else {
    show("overview");
    poll();
    pollAgents();
  }
}

function start() {
  if (state.timer) return;
  state.timer = setInterval(() => { if (state.page === "overview") poll(); }, POLL_MS);
  state.slowTimer = setInterval(() => {
    if (state.page === "overview") pollAgents();
    else pollHeader();
    if (state.page === "log") loadLog();
    if (state.page === "history" && state.offsets.history === 0) loadHistory();
  }, SLOW_POLL_MS);
  state.ticker = setInterval(tick, 250);
  if (state.page === "overview") { poll(); pollAgents(); }
  follow();
}

function stop() {
  clearInterval(state.timer);
  clearInterval(state.slowTimer);
  clearInterval(state.ticker);
  state.timer = null;
  stopFollow(); // sends nothing while hidden; resumes from the last event id when shown again
}

// Typing in a filter asks again once the typing pauses, from the first page.
function onFilter(ids, which, reload) {
  let timer = null;
  for (const id of ids) {
    const input = $(id);
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        for (const w of which) state.offsets[w] = 0;
        reload();
      }, 250);
    });
  }
}

function init() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) { // a token given in the fragment (never sent to the server) is kept for this tab
    state.token = decodeURIComponent(m[1]);
    sessionStorage.setItem("turnpool-token", state.token);
    history.replaceState(null, "", location.pathname);
  }
  onFilter(["f-agent", "f-session", "f-id", "f-q", "f-outcome"], ["running", "queued"], poll);
  onFilter(["h-agent", "h-session", "h-outcome", "h-q"], ["history"], loadHistory);
  for (const b of document.querySelectorAll("button.tab")) {
    b.addEventListener("click", () => { state.window = b.dataset.window; renderAgents(); });
  }
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => (document.hidden ? stop() : start()));
  route();
  if (!document.hidden) start();
}

init();

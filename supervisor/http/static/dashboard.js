// turnpool dashboard: one script, no build step, no dependency. It polls the JSON API once a second
// while the tab is visible (nothing at all while it is hidden) and follows one turn's events over
// Server-Sent Events (read with fetch, so a bearer token can go along). Everything shown comes from
// the daemon as data and is put into the page with textContent, never as HTML.
"use strict";

const OUTCOMES = ["completed", "failed", "aborted", "killed", "crashed"];
const POLL_MS = 1000;
const CHART_SECONDS = 300;
const MAX_EVENT_LINES = 500;

const state = {
  token: sessionStorage.getItem("turnpool-token") || "",
  timer: null,
  clockOffset: 0, // server now - local now, seconds
  running: [],
  follow: null, // {turnId, lastId, ctrl, count}
  page: "overview",
};

// ---- helpers ------------------------------------------------------------------------------

function $(id) { return document.getElementById(id); }

// An id as one path segment (R-TID): percent-encoded, and an id of dots only as %2E so that the
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

function fmtAge(seconds) {
  if (seconds == null || !isFinite(seconds)) return "–";
  seconds = Math.max(0, seconds);
  if (seconds < 60) return seconds.toFixed(1) + " s";
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + " m " + Math.floor(seconds % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
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
    throw new Error(res.status + " " + msg);
  }
  return { status: res.status, body };
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

// ---- overview -----------------------------------------------------------------------------

async function poll() {
  if (document.hidden) return;
  try {
    const [st, running, recent, series] = await Promise.all([
      api("/v1/status"),
      api("/v1/turns?state=running,queued&limit=200"),
      api("/v1/turns?state=ended&limit=30"),
      api("/v1/outcomes?seconds=" + CHART_SECONDS),
    ]);
    state.clockOffset = running.body.now - Date.now() / 1000;
    renderStatus(st.body);
    state.running = running.body.turns;
    renderRunning();
    renderRecent(recent.body.turns);
    renderChart(series.body);
    setLink(true);
  } catch (err) {
    setLink(false, err.message);
  }
}

function renderStatus(st) {
  const d = st.daemon || {};
  $("daemon").textContent = `pid ${d.pid ?? st.pid} · ${d.endpoint ?? ""} · ${st.state}` +
    (d.accepting === false ? " · not accepting (draining)" : "");
  $("queue").textContent = st.queue;
  $("running-count").textContent = st.running;
  const workers = st.workers || [];
  $("busy").textContent = `${workers.filter(w => w.state === "busy").length} / ${workers.length}`;
  const totals = st.outcomes || {};
  $("totals").replaceChildren(...OUTCOMES.map(o =>
    el("span", { class: "outcome-" + o, text: `${o} ${totals[o] || 0}   ` })));
  const body = $("workers").tBodies[0];
  body.replaceChildren(...workers.map(w => el("tr", { "data-worker": w.id },
    el("td", { text: w.id }), el("td", { text: w.pid }),
    el("td", { class: "state-" + w.state, text: w.state }),
    el("td", {}, w.turn_id ? el("a", { href: "#/turn/" + encodeURIComponent(w.turn_id), text: w.turn_id }) : "–"),
    el("td", { class: "num", text: (w.rss_mb ?? 0).toFixed(1) }),
    el("td", { class: "num", text: w.turns_run }))));
  if (!workers.length) body.append(el("tr", {}, el("td", { class: "empty", colSpan: 6, text: "no worker" })));
}

function cancellationCell(t) {
  if (!t.cause) return el("span", { text: t.state === "queued" ? "queued" : "–" });
  const step = t.escalation || "abort";
  const text = [`${t.cause.kind}: ${step === "abort" ? "Abort sent" : step.toUpperCase() + " sent"}`];
  const cell = el("span", { class: "esc " + step, "data-step": step, text: text[0] });
  if (t.next_signal && t.next_signal_at) {
    cell.append(el("span", { class: "countdown", "data-at": t.next_signal_at,
      "data-signal": t.next_signal, text: "" }));
  }
  return cell;
}

function renderRunning() {
  const body = $("running").tBodies[0];
  const now = serverNow();
  const rows = state.running.map(t => el("tr", { "data-turn": t.turn_id, "data-state": t.state },
    el("td", {}, el("a", { href: "#/turn/" + encodeURIComponent(t.turn_id), text: t.turn_id })),
    el("td", { text: t.agent }),
    el("td", { text: t.session || "–" }),
    el("td", { class: "age", "data-since": t.started_at || t.submitted_at,
      text: (t.started_at ? "" : "queued ") + fmtAge(now - (t.started_at || t.submitted_at)) }),
    el("td", { class: "num", text: t.events }),
    el("td", {}, cancellationCell(t)),
    el("td", {},
      el("button", { class: "danger cancel-turn", text: "cancel", disabled: !!t.cause,
        onclick: () => cancelTurn(t.turn_id) }),
      t.session ? " " : "",
      t.session ? el("button", { class: "danger cancel-session", text: "cancel session",
        onclick: () => cancelSession(t.session) }) : "")));
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colSpan: 7, text: "nothing running" })));
  body.replaceChildren(...rows);
  $("running-hint").textContent = state.running.length >= 200 ? "(first 200)" : "";
  tick();
}

// Ages and countdowns move every quarter second from the last poll, without asking the server.
function tick() {
  const now = serverNow();
  for (const td of document.querySelectorAll("#running td.age")) {
    const since = parseFloat(td.dataset.since);
    td.textContent = (td.parentElement.dataset.state === "queued" ? "queued " : "") + fmtAge(now - since);
  }
  for (const c of document.querySelectorAll(".countdown")) {
    const left = parseFloat(c.dataset.at) - now;
    c.textContent = ` · ${c.dataset.signal.toUpperCase()} in ${Math.max(0, left).toFixed(1)} s`;
  }
}

function renderRecent(turns) {
  const body = $("recent").tBodies[0];
  const rows = turns.map(t => el("tr", { "data-turn": t.turn_id },
    el("td", {}, el("a", { href: "#/turn/" + encodeURIComponent(t.turn_id), text: t.turn_id })),
    el("td", { text: t.agent }),
    el("td", { class: "outcome-" + t.outcome, text: t.outcome || "–" }),
    el("td", { text: t.cause ? t.cause.kind : "–" }),
    el("td", { class: "num", text: t.started_at && t.ended_at ? (t.ended_at - t.started_at).toFixed(3) : "–" }),
    el("td", { text: t.ended_at ? new Date(t.ended_at * 1000).toLocaleTimeString() : "–" })));
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colSpan: 6, text: "no turn ended yet" })));
  body.replaceChildren(...rows);
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

// ---- one turn -----------------------------------------------------------------------------

async function loadTurn(turnId, fresh) {
  let view;
  try {
    view = (await api("/v1/turns/" + seg(turnId) + "/state")).body;
  } catch (err) {
    $("turn-state").textContent = err.message;
    return;
  }
  $("turn-id").textContent = turnId;
  $("turn-state").textContent = view.outcome || view.state;
  $("turn-state").className = "badge outcome-" + (view.outcome || "");
  const facts = [["agent", view.agent], ["session", view.session || "–"], ["state", view.state],
    ["worker pid", view.worker_pid ?? "–"], ["events", view.events],
    ["cause", view.cause ? view.cause.kind : "–"], ["escalation", view.escalation || "–"],
    ["submitted", new Date(view.submitted_at * 1000).toLocaleTimeString()]];
  $("turn-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
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
  loadTurn(turnId, true);
  follow();
}

// ---- routing and visibility ---------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/turn\/(.+)$/);
  if (m) {
    state.page = "turn";
    $("overview").hidden = true;
    $("turn-page").hidden = false;
    const turnId = decodeURIComponent(m[1]);
    if (!state.follow || state.follow.turnId !== turnId) openTurn(turnId);
  } else {
    state.page = "overview";
    stopFollow();
    state.follow = null;
    $("overview").hidden = false;
    $("turn-page").hidden = true;
    poll();
  }
}

function start() {
  if (state.timer) return;
  state.timer = setInterval(() => { if (state.page === "overview") poll(); }, POLL_MS);
  state.ticker = setInterval(tick, 250);
  if (state.page === "overview") poll();
  follow();
}

function stop() {
  clearInterval(state.timer);
  clearInterval(state.ticker);
  state.timer = null;
  stopFollow(); // sends nothing while hidden; resumes from the last event id when shown again
}

function init() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) { // a token given in the fragment (never sent to the server) is kept for this tab
    state.token = decodeURIComponent(m[1]);
    sessionStorage.setItem("turnpool-token", state.token);
    history.replaceState(null, "", location.pathname);
  }
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => (document.hidden ? stop() : start()));
  route();
  if (!document.hidden) start();
}

init();

// The sidecar's web console: one ES module, no framework, no build step.
// Every view has its own URL (/ui/runs, /ui/runs/RUN_ID, /ui/bulk,
// /ui/audit, /ui/bus; filters in the query string); the data comes from
// the /v1 API of the same origin, with the session cookie and, on every
// change, the session's CSRF token.

const main = document.getElementById("main");
let session = null; // GET /ui/session
let viewAbort = null; // aborts the current view's requests and loops

// ---- small helpers -------------------------------------------------------

// shown is text as the page shows it: the Unicode controls that change
// the direction of what follows them (an override in a plan id would turn
// the rest of its line around) are shown as their code points instead.
function shown(s) {
  return String(s).replace(/[\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, (c) => `<U+${c.charCodeAt(0).toString(16).toUpperCase()}>`);
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = shown(v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg"; // a name, not a location: nothing is loaded from it

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children.flat(Infinity)) if (c) el.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  return el;
}

function toast(msg, error) {
  const box = document.getElementById("toast");
  const d = h("div", { class: error ? "error" : "" }, msg);
  box.append(d);
  setTimeout(() => d.remove(), error ? 9000 : 4000);
}

const roles = () => (session && session.roles) || [];
const can = (role) => roles().includes("admin") || roles().includes(role);

function badge(status, substatus) {
  const s = substatus || status;
  return h("span", { class: "badge s-" + s }, substatus ? `${status} (${substatus})` : status);
}

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function left(iso) {
  if (!iso) return "";
  const s = Math.round((new Date(iso) - Date.now()) / 1000);
  if (isNaN(s)) return "";
  const a = Math.abs(s);
  const t = a >= 3600 ? `${Math.floor(a / 3600)}h${String(Math.floor((a % 3600) / 60)).padStart(2, "0")}m`
    : a >= 60 ? `${Math.floor(a / 60)}m${String(a % 60).padStart(2, "0")}s` : `${a}s`;
  return s >= 0 ? `in ${t}` : `${t} ago`;
}

function bar(done, total) {
  const pct = total > 0 ? Math.round((100 * done) / total) : 100;
  const b = h("span", { class: "bar" + (done >= total ? " done" : ""), role: "progressbar", "aria-valuemin": "0",
    "aria-valuemax": String(total), "aria-valuenow": String(done), "aria-label": `${done} of ${total} drained` });
  const fill = h("span");
  fill.style.width = pct + "%"; // CSSOM, not an inline style attribute: allowed by the CSP
  b.append(fill);
  return b;
}

// ---- the API -------------------------------------------------------------

class APIError extends Error {
  constructor(status, code, message) { super(message || code); this.status = status; this.code = code; }
}

async function api(method, path, body, signal) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session && session.csrfToken) headers["X-CSRF-Token"] = session.csrfToken;
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin", signal, cache: "no-store" });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!resp.ok) {
    if (resp.status === 401 && !path.startsWith("/ui/")) { session = null; route(); }
    throw new APIError(resp.status, data && data.code, (data && data.message) || resp.statusText);
  }
  return data;
}

// ---- the equivalent CLI command -------------------------------------------

function q(s) { return /^[A-Za-z0-9_./:=,@%+-]+$/.test(s) ? s : `'${String(s).replace(/'/g, `'\\''`)}'`; }

// cli(args) is the command line of args: the command's words, flags with
// their values, and positional arguments (a run's or a step's id) given
// as { pos: value }. A positional argument that starts with "-" would be
// read as a flag: then every positional argument goes after "--".
function cli(args) {
  const xs = args.filter((a) => a !== null && a !== undefined && a !== "");
  const pos = xs.filter((a) => a.pos !== undefined).map((a) => q(String(a.pos)));
  const rest = xs.filter((a) => a.pos === undefined).map((a) => (a.raw ? a.raw : q(a)));
  rest.push("--server", q(location.origin));
  const dash = xs.some((a) => a.pos !== undefined && String(a.pos).startsWith("-"));
  return ["sidecar", rest[0], ...(dash ? [...rest.slice(1), "--", ...pos] : [...pos, ...rest.slice(1)])].join(" ");
}

function copyBox(cmdFn, label) {
  const code = h("code", { class: "mono" });
  const update = () => { code.textContent = cmdFn(); };
  update();
  const btn = h("button", { type: "button", class: "quiet", "aria-label": `Copy the command: ${label || "command"}`, onclick: async () => {
    const text = cmdFn();
    try { await navigator.clipboard.writeText(text); }
    catch {
      const ta = h("textarea", { "aria-hidden": "true" }); ta.value = text; document.body.append(ta); ta.select();
      document.execCommand("copy"); ta.remove();
    }
    toast("Copied: " + text);
  } }, "Copy command");
  const box = h("div", { class: "cmd" }, code, btn);
  box.update = update;
  return box;
}

// ---- routing ---------------------------------------------------------------

function go(url, replace) {
  if (replace) history.replaceState(null, "", url); else history.pushState(null, "", url);
  route();
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("a[href]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith("/ui/")) return;
  e.preventDefault();
  go(url.pathname + url.search);
});
window.addEventListener("popstate", () => route());

async function route() {
  if (viewAbort) viewAbort.abort();
  viewAbort = new AbortController();
  const signal = viewAbort.signal;
  if (!session) {
    try { session = await api("GET", "/ui/session"); }
    catch (e) { if (e.status === 401) return renderLogin(); return fail(e); }
  }
  renderWho();
  const path = location.pathname.replace(/\/+$/, "");
  const params = new URLSearchParams(location.search);
  const parts = path.split("/").slice(2); // after /ui
  const view = parts[0] || "runs";
  for (const a of document.querySelectorAll("nav a[data-view]")) {
    if (a.dataset.view === view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    // Bulk actions, their dry runs included, are an operator's.
    if (a.dataset.view === "bulk") a.hidden = !can("operator");
  }
  main.replaceChildren();
  try {
    if (view === "runs" && parts.length > 1) await renderRun(decodeURIComponent(parts.slice(1).join("/")), signal);
    else if (view === "runs") await renderRuns(params, signal);
    else if (view === "bulk") renderBulk(params, signal);
    else if (view === "audit") await renderAudit(params, signal);
    else if (view === "bus") await renderBus(params, signal);
    else main.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/ui/runs" }, "Runs")));
  } catch (e) {
    if (e.name !== "AbortError") fail(e);
  }
}

function fail(e) {
  main.append(h("p", { class: "error-box", role: "alert" }, `${e.code ? e.code + ": " : ""}${e.message}`));
}

function renderWho() {
  const who = document.getElementById("who");
  const out = document.getElementById("logout");
  if (!session.auth) { who.textContent = "no authentication (local)"; out.hidden = true; return; }
  who.textContent = `${session.name} (${session.roles.join(", ")})`;
  out.hidden = !session.csrfToken;
}

document.getElementById("logout").addEventListener("click", async () => {
  try { await api("POST", "/ui/logout"); } catch (e) { toast(e.message, true); }
  session = null;
  route();
});

function renderLogin() {
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true });
  const err = h("p", { role: "alert" });
  // method post: were the script's handler ever bypassed, the token would
  // go in a body (refused), never in the URL.
  const form = h("form", { method: "post", action: "/ui/login", onsubmit: async (e) => {
    e.preventDefault();
    try {
      session = await api("POST", "/ui/login", { token: input.value });
      input.value = "";
      route();
    } catch (x) { err.className = "error-box"; err.textContent = shown(x.message); }
  } }, h("label", { for: "token" }, "Bearer token (sidecar token new prints one)"), input, h("button", { type: "submit" }, "Sign in"), err);
  main.replaceChildren(h("section", { class: "login" }, h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "The token opens a session held in an HttpOnly cookie; the page never stores it."), form));
  input.focus();
}

// ---- Runs ------------------------------------------------------------------

const STATUSES = ["PENDING", "QUEUED", "APPROVED", "RUNNING", "PAUSED", "COMPLETED", "FAILED", "CANCELLED"];
const FILTERS = [["planId", "Plan"], ["tenantId", "Tenant"], ["labelSelector", "Label selector"]];

function filterForm(params, onApply, extra) {
  const fields = FILTERS.map(([k, label]) => h("label", {}, label,
    h("input", { name: k, value: params.get(k) || "", placeholder: k === "labelSelector" ? "team=data,tier!=gold" : "", size: k === "labelSelector" ? 24 : 14 })));
  const status = h("select", { name: "status" }, h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: params.get("status") === s }, s)));
  const draining = h("input", { type: "checkbox", name: "substatus", value: "DRAINING", checked: params.get("substatus") === "DRAINING" });
  const form = h("form", { class: "filters", role: "search", onsubmit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) p.set(k, v);
    onApply(p);
  } }, fields, extra ? null : h("label", {}, "Status", status), extra ? null : h("label", { class: "inline" }, draining, "Draining only"),
  extra, h("button", { type: "submit" }, "Apply"));
  return form;
}

function listQuery(params) {
  const p = new URLSearchParams();
  for (const k of ["planId", "tenantId", "labelSelector", "status", "substatus", "planVersion", "projectId", "environmentId"]) {
    if (params.get(k)) p.set(k, params.get(k));
  }
  return p;
}

function runsCommand(params) {
  const a = ["runs"];
  if (params.get("labelSelector")) a.push("-l", params.get("labelSelector"));
  if (params.get("planId")) a.push("--plan", params.get("planId"));
  if (params.get("status")) a.push("--status", params.get("status"));
  if (params.get("tenantId")) a.push("--tenant", params.get("tenantId"));
  if (params.get("substatus") === "DRAINING") a.push("--draining");
  a.push("-w");
  return cli(a);
}

function runRow(r) {
  const draining = r.substatus === "DRAINING";
  const drain = draining
    ? h("span", {}, bar(r.drained || 0, (r.drained || 0) + r.inFlight), ` ${r.drained || 0}/${(r.drained || 0) + r.inFlight} drained`)
    : "";
  let deadline = "";
  if (draining) {
    const eta = r.drainEta && r.drainEta.p50 ? `ETA ${left(r.drainEta.p50)}` : "ETA unknown";
    deadline = h("span", {}, `deadline ${left(r.drainDeadline)}`, h("br"), h("span", { class: "muted" }, eta));
  } else if (r.resumeAt) {
    deadline = `resumes ${left(r.resumeAt)}`;
  }
  const labels = Object.entries(r.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  return h("tr", { "data-run": r.runId, "data-created": r.createdAt },
    h("td", {}, h("a", { href: "/ui/runs/" + encodeURIComponent(r.runId), class: "mono" }, r.runId)),
    h("td", {}, `${r.planId}@${r.planVersion}`),
    h("td", {}, badge(r.status, r.substatus)),
    h("td", { class: "num", title: r.planSteps ? null : "the plan could not be read" }, `${r.done}/${r.planSteps ? Math.max(r.planSteps, r.steps) : "?"}`),
    h("td", { class: "num" }, String(r.inFlight)),
    h("td", {}, drain),
    h("td", {}, deadline),
    h("td", { class: "hide-narrow" }, labels),
    h("td", { class: "hide-narrow" }, when(r.createdAt)));
}

async function renderRuns(params, signal) {
  const t0 = performance.now();
  main.append(h("h1", {}, "Runs"), filterForm(params, (p) => go("/ui/runs" + (p.toString() ? "?" + p : ""))), copyBox(() => runsCommand(params), "list runs"));
  const status = h("p", { class: "muted", "aria-live": "polite" }, "Loading…");
  const tbody = h("tbody");
  main.append(status, h("div", { class: "table-wrap" }, h("table", { id: "runs" },
    h("caption", { class: "skip" }, "Runs, newest first"),
    h("thead", {}, h("tr", {}, ["Run", "Plan", "Status", "Steps done", "In flight", "Drain", "Deadline / ETA", "Labels", "Created"]
      .map((c, i) => h("th", { scope: "col", class: (i === 3 || i === 4 ? "num " : "") + (i >= 7 ? "hide-narrow" : "") }, c)))),
    tbody)));
  const lq = listQuery(params);
  lq.set("limit", "100");
  const page = await api("GET", "/v1/runs?" + lq, undefined, signal);
  const rows = new Map();
  for (const r of page.runs) { const tr = runRow(r); rows.set(r.runId, tr); tbody.append(tr); }
  let cont = page.continue;
  const more = h("button", { type: "button", class: "quiet", hidden: !cont, onclick: async () => {
    const mq = listQuery(params); mq.set("limit", "100"); mq.set("continue", cont);
    const next = await api("GET", "/v1/runs?" + mq, undefined, signal);
    for (const r of next.runs) if (!rows.has(r.runId)) { const tr = runRow(r); rows.set(r.runId, tr); tbody.append(tr); }
    cont = next.continue; more.hidden = !cont;
    status.textContent = `${rows.size} runs shown${cont ? " (more below)" : ""}; live`;
  } }, "Show more");
  main.append(more);
  status.textContent = `${rows.size} run${rows.size === 1 ? "" : "s"} shown${cont ? " (more below)" : ""}; live`;
  // The first screen's time, from the navigation's start (the browser
  // test reports it for 10,000 runs, BENCHMARKS.md).
  document.documentElement.dataset.firstScreenMs = String(Math.round(performance.now()));
  document.documentElement.dataset.listMs = String(Math.round(performance.now() - t0));
  document.documentElement.dataset.ready = "runs";
  // Live updates from the list's watch.
  let revision = page.revision;
  const wq = listQuery(params);
  wq.set("watch", "true"); wq.set("timeoutSeconds", "30");
  while (!signal.aborted) {
    wq.set("revision", String(revision));
    let ch;
    try { ch = await api("GET", "/v1/runs?" + wq, undefined, signal); }
    catch (e) {
      if (e.name === "AbortError" || signal.aborted) return;
      status.textContent = `watch interrupted (${e.message}); retrying`;
      await new Promise((r) => setTimeout(r, 2000));
      continue;
    }
    revision = ch.revision;
    for (const r of ch.runs) {
      const old = rows.get(r.runId);
      if (r.matches === false) { if (old) { old.remove(); rows.delete(r.runId); } continue; }
      const tr = runRow(r);
      tr.classList.add("flash");
      setTimeout(() => tr.classList.remove("flash"), 1500);
      if (old) old.replaceWith(tr);
      else {
        // In its place, newest first: before the first row created
        // before it. A run older than every row shown while more are
        // below is beyond what is shown ("Show more" reaches it).
        const created = Date.parse(r.createdAt);
        const next = [...tbody.children].find((x) => Date.parse(x.dataset.created) < created);
        if (next) next.before(tr);
        else if (!cont) tbody.append(tr);
        else continue;
      }
      rows.set(r.runId, tr);
    }
    status.textContent = `${rows.size} runs shown${cont ? " (more below)" : ""}; live`;
  }
}

// ---- Run -------------------------------------------------------------------

const CONTROL_EVENTS = new Set(["RunPaused", "RunResumed", "RunCancelRequested", "RunCancelled", "RunStepRetryRequested",
  "RunDrainCompleted", "RunDrainTimedOut"]);

function payloadOf(ev) { return ev.payload && typeof ev.payload === "object" ? ev.payload : {}; }

function drainedOf(run) {
  if (!run.pause || run.status !== "PAUSED") return 0;
  const at = Date.parse(run.pause.pausedAt);
  return run.steps.filter((s) => s.startedAt && s.completedAt && Date.parse(s.startedAt) <= at && Date.parse(s.completedAt) >= at).length;
}

function layoutGraph(steps) {
  const byId = new Map(steps.map((s) => [s.stepId, s]));
  const level = new Map();
  const depth = (id, seen = new Set()) => {
    if (level.has(id)) return level.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const deps = (byId.get(id) || {}).dependsOn || [];
    const d = deps.length ? 1 + Math.max(...deps.map((x) => depth(x, seen))) : 0;
    level.set(id, d);
    return d;
  };
  steps.forEach((s) => depth(s.stepId));
  const cols = [];
  for (const s of steps) { const l = level.get(s.stepId); (cols[l] = cols[l] || []).push(s.stepId); }
  return { cols, level };
}

function renderGraph(steps, stateById) {
  const W = 170, H = 54, GX = 60, GY = 18;
  const { cols } = layoutGraph(steps);
  const pos = new Map();
  cols.forEach((ids, c) => ids.forEach((id, r) => pos.set(id, { x: 10 + c * (W + GX), y: 10 + r * (H + GY) })));
  const width = 20 + cols.length * (W + GX) - GX;
  const height = 20 + Math.max(...cols.map((c) => c.length)) * (H + GY) - GY;
  const g = svg("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": "Step graph" });
  for (const s of steps) {
    for (const d of s.dependsOn || []) {
      const a = pos.get(d), b = pos.get(s.stepId);
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      g.append(svg("path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2 - 4},${y2}` }));
    }
  }
  for (const s of steps) {
    const st = stateById.get(s.stepId);
    const status = st ? st.status : "PENDING";
    const attempts = st ? `attempt ${st.logicalAttemptId}${st.engineAttemptId > 1 ? "." + st.engineAttemptId : ""}` : "not started";
    const p = pos.get(s.stepId);
    const label = `${s.stepId}: ${status}${st && st.held ? " (held)" : ""}, ${attempts}, ${s.executor}`;
    const node = svg("g", { class: status, tabindex: "0", role: "img", "aria-label": label, transform: `translate(${p.x},${p.y})` },
      svg("title", {}, label),
      svg("rect", { width: W, height: H }),
      svg("text", { x: 10, y: 20 }, s.stepId.length > 20 ? s.stepId.slice(0, 19) + "…" : s.stepId),
      svg("text", { x: 10, y: 40 }, `${status}${st && st.held ? " held" : ""} · ${attempts}`));
    g.append(node);
  }
  return h("div", { class: "graph-wrap" }, g);
}

function controlForm(title, fields, onSubmit, cmdFn, danger) {
  const reason = h("input", { name: "reason", required: true, size: 32, maxlength: 512, placeholder: "what happened, a ticket" });
  const form = h("form", {}, h("label", {}, "Reason (required)", reason), fields || [], h("button", { type: "submit", class: danger ? "danger" : "" }, title));
  const box = copyBox(() => cmdFn(new FormData(form)), title);
  form.addEventListener("input", () => box.update());
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const btn = form.querySelector("button[type=submit]");
    btn.disabled = true;
    try { await onSubmit(new FormData(form)); form.reset(); box.update(); }
    catch (x) { toast(`${title}: ${x.code ? x.code + ": " : ""}${x.message}`, true); }
    finally { btn.disabled = false; }
  });
  return h("details", { class: "action" }, h("summary", {}, title), form, box);
}

async function renderRun(runId, signal) {
  const enc = encodeURIComponent(runId);
  main.append(h("p", {}, h("a", { href: "/ui/runs" }, "← Runs")), h("h1", {}, "Run ", h("span", { class: "mono" }, runId)));
  const head = h("section", { "aria-label": "Run state" });
  const controls = h("section", { "aria-label": "Control" });
  const graphBox = h("section", { "aria-label": "Steps" });
  const timeline = h("tbody");
  main.append(head, controls, graphBox, h("h2", {}, "Events"),
    h("div", { class: "table-wrap" }, h("table", { id: "events" }, h("thead", {}, h("tr", {},
      ["#", "Persisted", "Event", "Step", "Attempt", "Requested by", "Reason / detail"].map((c) => h("th", { scope: "col" }, c)))), timeline)));

  let graph = null;
  try { graph = await api("GET", `/v1/runs/${enc}/plan`, undefined, signal); } catch (e) { if (e.name === "AbortError") throw e; }
  let after = 0;
  let lastSeq = -1;
  const op = (action, body, path) => api("POST", path || `/v1/runs/${enc}/${action}`, body).then((v) => {
    toast(`${action}: ${v.status}${v.substatus ? " (" + v.substatus + ")" : ""}${v.notice ? " — " + v.notice : ""}`);
    refresh();
  });
  let controlsFor = "";

  async function refresh() {
    const run = await api("GET", `/v1/runs/${enc}`, undefined, signal);
    const page = await api("GET", `/v1/runs/${enc}/events?afterSeq=${after}&limit=1000`, undefined, signal);
    for (const ev of page.events) {
      const p = payloadOf(ev);
      let detail = p.reason || "";
      if (ev.eventType === "RunPaused") detail += `${detail ? "; " : ""}drain timeout ${p.drainTimeoutSeconds || "default"}s${p.resumeAt ? ", resumes at " + when(p.resumeAt) : ""}`;
      if (ev.eventType === "RunDrainTimedOut") detail += `PAUSE_DRAIN_TIMEOUT after ${p.waitedSeconds}s; still in flight: ${(p.inFlightStepIds || []).join(", ")}`;
      if (p.error) detail += `${detail ? "; " : ""}${p.error.code || ""} ${p.error.message || ""}`;
      timeline.append(h("tr", { class: CONTROL_EVENTS.has(ev.eventType) ? "control" : "" },
        h("td", { class: "num" }, String(ev.runSeq)), h("td", {}, when(ev.persistedAt)), h("td", {}, ev.eventType),
        h("td", { class: "mono" }, ev.stepId || ""), h("td", { class: "num" }, String(ev.logicalAttemptId)),
        h("td", {}, p.requestedBy || ""), h("td", {}, detail)));
    }
    after = page.nextAfterSeq;
    if (run.lastEventSeq === lastSeq) return run;
    lastSeq = run.lastEventSeq;

    const drained = drainedOf(run);
    const inflight = run.drain ? run.drain.inFlightStepIds.length : 0;
    const kv = [["Status", badge(run.status, run.substatus)], ["Message", run.message],
      ["Plan", `${run.planId}@${run.planVersion}`], ["Tenant / project / env", `${run.tenantId} / ${run.projectId} / ${run.environmentId}`],
      ["Labels", Object.entries(run.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none"],
      ["Started", when(run.startedAt)], ["Engine", run.engineRunRef || ""]];
    if (run.drain) {
      kv.push(["Pause", `cycle ${run.drain.cycle} at ${when(run.drain.pausedAt)} by ${run.pause.requestedBy || "?"}: ${run.pause.reason || ""}`]);
      kv.push(["Drain", h("span", { id: "drain" }, bar(drained, drained + inflight),
        ` ${drained}/${drained + inflight} drained, ${inflight} in flight${inflight ? " (" + run.drain.inFlightStepIds.join(", ") + ")" : ""}`)]);
      if (run.drain.draining) kv.push(["Deadline", `${when(run.drain.deadline)} (${left(run.drain.deadline)})`]);
      if (run.drainEta && run.drainEta.p50) kv.push(["ETA", `p50 ${left(run.drainEta.p50)}, p90 ${left(run.drainEta.p90)}`]);
      if (run.drain.timedOut) kv.push(["Drain ended", "PAUSE_DRAIN_TIMEOUT"]);
      if (run.pause.resumeAt) kv.push(["Scheduled resume", `${when(run.pause.resumeAt)} (${left(run.pause.resumeAt)})`]);
    }
    head.replaceChildren(h("dl", { class: "kv" }, kv.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    document.documentElement.dataset.runStatus = run.status + (run.substatus ? "/" + run.substatus : "");

    const stateById = new Map(run.steps.map((s) => [s.stepId, s]));
    const steps = graph && graph.steps.length ? graph.steps
      : run.steps.map((s) => ({ stepId: s.stepId, executor: "", dependsOn: [] }));
    graphBox.replaceChildren(h("h2", {}, "Steps"), steps.length ? renderGraph(steps, stateById) : h("p", { class: "muted" }, "No step has started."),
      h("div", { class: "table-wrap" }, h("table", { id: "steps" }, h("thead", {}, h("tr", {},
        ["Step", "Status", "Attempt", "Started", "Completed", "Error"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, steps.map((s) => { const st = stateById.get(s.stepId) || {}; return h("tr", {},
        h("td", { class: "mono" }, s.stepId), h("td", {}, badge(st.status || "PENDING")),
        h("td", { class: "num" }, st.logicalAttemptId ? `${st.logicalAttemptId}${st.engineAttemptId ? "." + st.engineAttemptId : ""}` : ""),
        h("td", {}, when(st.startedAt)), h("td", {}, when(st.completedAt)),
        h("td", {}, st.error ? `${st.error.code}: ${st.error.message}` : "")); })))));

    const key = run.status + "|" + run.steps.filter((s) => s.held || s.status === "FAILED").map((s) => s.stepId).join(",");
    if (key !== controlsFor) { controlsFor = key; renderControls(run); }
    return run;
  }

  function renderControls(run) {
    controls.replaceChildren();
    if (!can("operator")) {
      controls.append(h("p", { class: "muted" }, session.auth ? `${session.name} may view, not control, runs.` : ""));
      return;
    }
    const terminal = ["COMPLETED", "FAILED", "CANCELLED"].includes(run.status);
    if (terminal) return;
    const forms = [];
    if (run.status === "RUNNING") {
      const timeout = h("input", { name: "timeoutSeconds", type: "number", min: 1, max: 604800, size: 8, placeholder: "default" });
      const after = h("input", { name: "resumeAfterMinutes", type: "number", min: 1, size: 8, placeholder: "never" });
      forms.push(controlForm("Pause", [h("label", {}, "Drain timeout (s)", timeout), h("label", {}, "Resume after (min)", after)], (f) => {
        const body = { reason: f.get("reason") };
        if (f.get("timeoutSeconds")) body.timeoutSeconds = Number(f.get("timeoutSeconds"));
        if (f.get("resumeAfterMinutes")) body.resumeAfterSeconds = Math.round(60 * Number(f.get("resumeAfterMinutes")));
        return op("pause", body);
      }, (f) => cli(["pause", { pos: runId }, "--reason", f.get("reason") || "REASON",
        f.get("timeoutSeconds") ? { raw: "--timeout " + Number(f.get("timeoutSeconds")) + "s" } : "",
        f.get("resumeAfterMinutes") ? { raw: "--for " + Number(f.get("resumeAfterMinutes")) + "m" } : ""])));
    }
    if (run.status === "PAUSED") {
      forms.push(controlForm("Resume", [], (f) => op("resume", { reason: f.get("reason") }),
        (f) => cli(["resume", { pos: runId }, "--reason", f.get("reason") || "REASON"])));
      const retriable = run.steps.filter((s) => s.held || s.status === "FAILED");
      if (retriable.length) {
        const sel = h("select", { name: "stepId" }, retriable.map((s) => h("option", { value: s.stepId }, s.stepId)));
        forms.push(controlForm("Retry step", [h("label", {}, "Step", sel)], (f) =>
          op("retry", { reason: f.get("reason") }, `/v1/runs/${enc}/steps/${encodeURIComponent(f.get("stepId"))}/retry`),
        (f) => cli(["retry", { pos: runId }, { pos: f.get("stepId") || retriable[0].stepId }, "--reason", f.get("reason") || "REASON"])));
      }
    }
    forms.push(controlForm("Cancel", [], (f) => op("cancel", { reason: f.get("reason") }),
      (f) => cli(["cancel", { pos: runId }, "--reason", f.get("reason") || "REASON"]), true));
    controls.append(h("h2", {}, "Control"), ...forms);
  }

  let run = await refresh();
  document.documentElement.dataset.ready = "run";
  while (!signal.aborted) {
    await new Promise((r) => setTimeout(r, run && ["COMPLETED", "FAILED", "CANCELLED"].includes(run.status) ? 10000 : 1000));
    if (signal.aborted) return;
    try { run = await refresh(); } catch (e) { if (e.name === "AbortError") return; }
  }
}

// ---- Bulk ------------------------------------------------------------------

function renderBulk(params, signal) {
  const action = params.get("action") || "pause";
  if (!can("operator")) {
    main.append(h("h1", {}, "Bulk action"), h("p", { class: "muted" }, `${session.name} may view, not control, runs: bulk actions and their dry runs need the operator role.`));
    document.documentElement.dataset.ready = "bulk";
    return;
  }
  main.append(h("h1", {}, "Bulk action"),
    h("p", { class: "muted" }, "Select runs, see exactly which runs and in-flight steps the action touches (dry run), then confirm."));
  const actionSel = h("select", { name: "action" }, ["pause", "resume", "cancel"].map((a) => h("option", { value: a, selected: a === action }, a)));
  const reason = h("input", { name: "reason", required: true, size: 30, maxlength: 512, value: params.get("reason") || "" });
  const pauseFields = h("span", { class: "row" },
    h("label", {}, "Drain timeout (s)", h("input", { name: "timeoutSeconds", type: "number", min: 1, size: 8, value: params.get("timeoutSeconds") || "" })),
    h("label", {}, "Resume after (min)", h("input", { name: "resumeAfterMinutes", type: "number", min: 1, size: 8, value: params.get("resumeAfterMinutes") || "" })));
  const resumeFields = h("span", { class: "row" },
    h("label", {}, "Runs per second", h("input", { name: "maxPerSecond", type: "number", min: 0.1, step: "any", size: 6, value: params.get("maxPerSecond") || "" })),
    h("label", {}, "Batch", h("input", { name: "batch", type: "number", min: 1, size: 6, value: params.get("batch") || "" })),
    h("label", {}, "Interval (s)", h("input", { name: "intervalSeconds", type: "number", min: 1, size: 6, value: params.get("intervalSeconds") || "" })));
  const form = filterForm(params, () => {}, [h("label", {}, "Action", actionSel), h("label", {}, "Reason (required)", reason), pauseFields, resumeFields]);
  form.querySelector("button[type=submit]").textContent = "Dry run";
  const sync = () => { pauseFields.hidden = actionSel.value !== "pause"; resumeFields.hidden = actionSel.value !== "resume"; };
  sync();
  const out = h("section", { "aria-live": "polite", id: "bulk-result" });
  const body = (dry) => {
    const f = new FormData(form);
    const b = { reason: f.get("reason"), dryRun: dry };
    for (const k of ["labelSelector", "planId", "tenantId"]) if (f.get(k)) b[k] = f.get(k);
    if (actionSel.value === "pause") {
      if (f.get("timeoutSeconds")) b.timeoutSeconds = Number(f.get("timeoutSeconds"));
      if (f.get("resumeAfterMinutes")) b.resumeAfterSeconds = Math.round(60 * Number(f.get("resumeAfterMinutes")));
    }
    if (actionSel.value === "resume") {
      if (f.get("maxPerSecond")) b.maxPerSecond = Number(f.get("maxPerSecond"));
      if (f.get("batch")) b.batch = Number(f.get("batch"));
      if (f.get("intervalSeconds")) b.intervalSeconds = Number(f.get("intervalSeconds"));
    }
    return b;
  };
  const command = (dry) => {
    const b = body(dry);
    const a = [actionSel.value];
    if (b.labelSelector) a.push("-l", b.labelSelector);
    if (b.planId) a.push("--plan", b.planId);
    if (b.tenantId) a.push("--tenant", b.tenantId);
    a.push("--reason", b.reason || "REASON");
    if (b.timeoutSeconds) a.push({ raw: `--timeout ${b.timeoutSeconds}s` });
    if (b.resumeAfterSeconds) a.push({ raw: `--for ${b.resumeAfterSeconds}s` });
    if (b.maxPerSecond) a.push({ raw: `--max-rate ${b.maxPerSecond}/s` });
    if (b.batch) a.push({ raw: `--batch ${b.batch}` });
    if (b.intervalSeconds) a.push({ raw: `--interval ${b.intervalSeconds}s` });
    if (dry) a.push({ raw: "--dry-run" });
    return cli(a);
  };
  const box = copyBox(() => command(true), "bulk dry run");
  const keepURL = () => {
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v && k !== "reason") p.set(k, v);
    history.replaceState(null, "", "/ui/bulk" + (p.toString() ? "?" + p : ""));
  };
  form.addEventListener("input", () => { sync(); box.update(); });
  form.addEventListener("change", () => { sync(); box.update(); keepURL(); });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    keepURL();
    out.replaceChildren(h("p", {}, "Dry run…"));
    const act = actionSel.value;
    const sent = body(true);
    try {
      const dry = await api("POST", `/v1/runs:${act}`, sent, signal);
      const n = dry.runs.length;
      const confirm = h("button", { type: "button", class: act === "cancel" ? "danger" : "", disabled: !n || !can("operator"), id: "bulk-confirm",
        onclick: async () => {
          confirm.disabled = true;
          try {
            // The runs the dry run listed, and no other: a run that began
            // to match since was not shown, so it is not touched.
            const done = await api("POST", `/v1/runs:${act}`, { ...sent, dryRun: false, runIds: dry.runs.map((r) => r.runId) }, signal);
            out.replaceChildren(h("h2", {}, `${act}: done`), h("p", {}, Object.entries(done.counts).map(([k, v]) => `${k}: ${v}`).join(", ")),
              bulkTable(done.runs, false), progressBox(sent, signal));
          } catch (x) { toast(`${act}: ${x.code ? x.code + ": " : ""}${x.message}`, true); confirm.disabled = false; }
        } }, `Confirm: ${act} ${n} run${n === 1 ? "" : "s"}`);
      out.replaceChildren(h("h2", {}, `Dry run: ${act} would touch ${n} run${n === 1 ? "" : "s"}`),
        bulkTable(dry.runs, true), h("div", { class: "actions" }, confirm), copyBox(() => command(false), "bulk action"));
    } catch (x) {
      out.replaceChildren(h("p", { class: "error-box", role: "alert" }, `${x.code ? x.code + ": " : ""}${x.message}`));
    }
  });
  main.append(form, box, out);
  document.documentElement.dataset.ready = "bulk";
}

function bulkTable(runs, dry) {
  return h("div", { class: "table-wrap" }, h("table", { class: "bulk" }, h("thead", {}, h("tr", {},
    ["Run", "Plan", "Status", dry ? "In-flight steps" : "Outcome", dry ? "" : "Detail"].map((c) => h("th", { scope: "col" }, c)))),
  h("tbody", {}, runs.map((r) => h("tr", {},
    h("td", {}, h("a", { class: "mono", href: "/ui/runs/" + encodeURIComponent(r.runId) }, r.runId)),
    h("td", {}, r.planId), h("td", {}, badge(r.status, r.substatus)),
    h("td", { class: "mono" }, dry ? (r.inFlightStepIds || []).join(", ") || "none" : r.outcome),
    h("td", {}, dry ? "" : r.error ? `${r.error.code}: ${r.error.message}` : r.resumeAt ? `resumes ${when(r.resumeAt)}` : ""))))));
}

function progressBox(sel, signal) {
  const box = h("section", { "aria-live": "polite" }, h("h2", {}, "Progress"), h("p", {}, "…"));
  const q = new URLSearchParams();
  for (const k of ["labelSelector", "planId", "tenantId"]) if (sel[k]) q.set(k, sel[k]);
  q.set("limit", "5000");
  (async () => {
    while (!signal.aborted) {
      try {
        const list = await api("GET", "/v1/runs?" + q, undefined, signal);
        const counts = {};
        let inflight = 0;
        for (const r of list.runs) { const k = r.status + (r.substatus ? " (" + r.substatus + ")" : ""); counts[k] = (counts[k] || 0) + 1; inflight += r.substatus === "DRAINING" ? r.inFlight : 0; }
        box.lastChild.textContent = Object.entries(counts).map(([k, v]) => `${k}: ${v}`).join(", ") + `; ${inflight} steps still in flight in draining runs`;
      } catch (e) { if (e.name === "AbortError") return; }
      await new Promise((r) => setTimeout(r, 1500));
    }
  })();
  return box;
}

// ---- Audit -----------------------------------------------------------------

// AUDIT_RUNS bounds the runs' logs the audit view reads (the CLI's bound).
const AUDIT_RUNS = 1000;

function auditOf(ev) {
  const p = payloadOf(ev);
  const m = { RunPaused: "pause", RunResumed: "resume", RunCancelRequested: "cancel", RunStepRetryRequested: "retry step",
    RunDrainCompleted: "drain completed", RunDrainTimedOut: "drain timed out", RunCancelled: "cancelled" }[ev.eventType];
  if (!m) return null;
  let detail = "";
  if (ev.eventType === "RunPaused") detail = `cycle ${ev.logicalAttemptId}${p.resumeAt ? ", resumes at " + when(p.resumeAt) : ""}${p.stepId ? ", step " + p.stepId + " failed" : ""}`;
  if (ev.eventType === "RunStepRetryRequested") detail = `step ${p.stepId}`;
  if (ev.eventType === "RunDrainTimedOut") detail = `PAUSE_DRAIN_TIMEOUT after ${p.waitedSeconds}s`;
  return { at: ev.persistedAt, action: m, by: p.requestedBy || "", reason: p.reason || "", detail };
}

async function renderAudit(params, signal) {
  const by = h("input", { name: "by", value: params.get("by") || "", size: 12 });
  const act = h("select", { name: "action" }, ["", "pause", "resume", "cancel", "retry step"].map((a) => h("option", { value: a, selected: params.get("action") === a }, a || "any")));
  const since = h("input", { name: "since", value: params.get("since") || "24h", size: 6 });
  main.append(h("h1", {}, "Audit"), h("p", { class: "muted" }, "Who paused, resumed, cancelled or retried which run, when and why (from the runs' event logs)."),
    filterForm(params, (p) => go("/ui/audit?" + p), [h("label", {}, "By", by), h("label", {}, "Action", act), h("label", {}, "Since (e.g. 24h)", since)]),
    copyBox(() => { const a = ["audit"]; if (params.get("labelSelector")) a.push("-l", params.get("labelSelector"));
      if (params.get("planId")) a.push("--plan", params.get("planId")); if (!params.get("labelSelector") && !params.get("planId")) a.push("--status", STATUSES.join(","));
      a.push("--since", params.get("since") || "24h"); return cli(a); }, "audit"));
  const status = h("p", { class: "muted", "aria-live": "polite" }, "Reading the runs' logs…");
  const tbody = h("tbody");
  main.append(status, h("div", { class: "table-wrap" }, h("table", { id: "audit" }, h("thead", {}, h("tr", {},
    ["Time", "Run", "Action", "By", "Reason", "Detail"].map((c) => h("th", { scope: "col" }, c)))), tbody)));
  const m = /^(\d+)([mhd])$/.exec(params.get("since") || "24h");
  const from = m ? Date.now() - Number(m[1]) * { m: 60e3, h: 3600e3, d: 86400e3 }[m[2]] : 0;
  // The runs touched since then, however old: an action is an event of
  // its run. Up to AUDIT_RUNS logs are read; past that the page says so.
  const lq = listQuery(params);
  lq.set("limit", "500");
  lq.set("updatedSince", new Date(from).toISOString());
  const ids = [];
  let more = false;
  for (let cont = ""; ;) {
    if (cont) lq.set("continue", cont);
    const list = await api("GET", "/v1/runs?" + lq, undefined, signal);
    ids.push(...list.runs.map((r) => r.runId));
    cont = list.continue || "";
    if (!cont) break;
    if (ids.length >= AUDIT_RUNS) { more = true; break; }
  }
  more = more || ids.length > AUDIT_RUNS;
  ids.splice(AUDIT_RUNS);
  const entries = [];
  let i = 0;
  await Promise.all(Array.from({ length: 6 }, async () => {
    while (i < ids.length) {
      const id = ids[i++];
      let after = 0;
      for (;;) {
        const page = await api("GET", `/v1/runs/${encodeURIComponent(id)}/events?afterSeq=${after}&limit=1000`, undefined, signal);
        for (const ev of page.events) { const e = auditOf(ev); if (e && Date.parse(e.at) >= from) entries.push({ ...e, runId: id }); }
        after = page.nextAfterSeq;
        if (page.events.length < 1000) break;
      }
    }
  }));
  const wantBy = params.get("by"), wantAct = params.get("action");
  const shown = entries.filter((e) => (!wantBy || e.by === wantBy) && (!wantAct || e.action === wantAct)).sort((a, b) => Date.parse(b.at) - Date.parse(a.at));
  for (const e of shown) {
    tbody.append(h("tr", {}, h("td", {}, when(e.at)), h("td", {}, h("a", { class: "mono", href: "/ui/runs/" + encodeURIComponent(e.runId) }, e.runId)),
      h("td", {}, e.action), h("td", {}, e.by), h("td", {}, e.reason), h("td", {}, e.detail)));
  }
  status.textContent = more
    ? `${shown.length} actions in the ${ids.length} newest runs changed since then: more runs changed, and actions on the others are not shown; narrow the filter or the time`
    : `${shown.length} ${shown.length === 1 ? "action" : "actions"} in ${ids.length} ${ids.length === 1 ? "run" : "runs"} changed since then`;
  document.documentElement.dataset.ready = "audit";
}

// ---- Event bus ---------------------------------------------------------------

async function renderBus(params, signal) {
  main.append(h("h1", {}, "Event bus"));
  let bus = null;
  try { bus = await api("GET", "/v1/bus", undefined, signal); }
  catch (e) {
    if (e.status === 404) { main.append(h("p", {}, "This sidecar has no event bus sinks (serve --bus-sink …)."), copyBox(() => cli(["bus"]), "bus")); document.documentElement.dataset.ready = "bus"; return; }
    // A scoped principal may not see the sinks' positions and counts
    // (they cover every tenant's events), but may see its own runs' dead
    // letters of a sink it names.
    if (e.status !== 403 || !params.get("sink")) throw e;
    main.append(h("p", { class: "muted" }, "The sinks' positions and counts cover every tenant's events: your scope shows only your runs' dead letters."));
  }
  if (bus) main.append(copyBox(() => cli(["bus"]), "bus status"), h("div", { class: "table-wrap" }, h("table", { id: "sinks" }, h("thead", {}, h("tr", {},
    ["Sink", "Vocabulary", "Acknowledged through", "Lag (events)", "Dead letters"].map((c) => h("th", { scope: "col" }, c)))),
  h("tbody", {}, bus.sinks.map((s) => h("tr", {}, h("td", {}, h("a", { href: "/ui/bus?sink=" + encodeURIComponent(s.name) }, s.name)), h("td", {}, s.vocabulary),
    h("td", { class: "num" }, String(s.cursor)), h("td", { class: "num" }, String(Math.max(0, s.lastSeq - s.cursor))), h("td", { class: "num" }, String(s.deadLetters))))))));
  const sink = params.get("sink");
  if (!sink) { document.documentElement.dataset.ready = "bus"; return; }
  const dl = await api("GET", "/v1/bus/deadletters?sink=" + encodeURIComponent(sink) + "&limit=200", undefined, signal);
  main.append(h("h2", {}, `Dead letters of ${sink}`), copyBox(() => cli(["bus", "deadletters", "--sink", sink]), "dead letters"));
  if (can("operator") && dl.deadLetters.length) {
    main.append(h("div", { class: "actions" }, h("button", { type: "button", onclick: async () => {
      try {
        const res = await api("POST", "/v1/bus/deadletters:replay", { sink, keys: [] });
        toast("replay: " + Object.entries(res.counts).map(([k, v]) => `${k} ${v}`).join(", "));
        route();
      } catch (x) { toast(x.message, true); }
    } }, `Replay all ${dl.deadLetters.length}`)), copyBox(() => cli(["bus", "replay", "--sink", sink]), "replay"));
  }
  main.append(h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {}, ["Dead at", "Run", "Event", "Attempts", "Error"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, dl.deadLetters.map((d) => h("tr", {}, h("td", {}, when(d.deadAt)),
      h("td", {}, h("a", { class: "mono", href: "/ui/runs/" + encodeURIComponent(d.runId) }, d.runId)), h("td", {}, d.eventType),
      h("td", { class: "num" }, String(d.attempts)), h("td", {}, d.error)))))));
  document.documentElement.dataset.ready = "bus";
}

route();

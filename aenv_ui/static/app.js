// aenv-ui: the Environment Center's front-end. Plain JavaScript, no build step, no CDN.
// Every piece of data is put in the page as text (textContent), never as HTML: trajectories
// hold what an agent and an environment wrote.
"use strict";

const CONFIG = JSON.parse(document.getElementById("aenv-ui-config").textContent);
const BASE = CONFIG.base;
const HUB = CONFIG.mode === "hub";
const API = BASE + "/api"; // the runs' API: aenv ui's /api, the hub's /ui/api (a tenant's pushed runs)
const FOLD = 2000; // characters shown before a text is folded (the rest one click away)
const main = document.getElementById("main");
let timer = null; // the live page's refresh
let generation = 0; // each route's render: a slower, older one never overwrites a newer one
let shown = null; // the address last shown: a live page's refresh keeps the focus where it is

// -- small helpers ------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : String(x));
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const secs = (x) => (x === null || x === undefined ? "–" : x < 1 ? (1000 * x).toFixed(0) + " ms" : x.toFixed(2) + " s");
const enc = encodeURIComponent;
function status(text) { document.getElementById("status").textContent = text; }

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || (HUB ? "/envs" : "/runs");
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query || "") };
}
function go(path, query) {
  const q = query && [...query].length ? "?" + query.toString() : "";
  location.hash = "#" + path + q;
}

class Stale extends Error {}

async function api(path, options = {}) {
  const started = generation;
  const headers = Object.assign({}, options.headers || {});
  if (HUB) {
    const key = sessionStorage.getItem("aenv-hub-key");
    if (key) headers.Authorization = "Bearer " + key;
    if (options.body) headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, Object.assign({}, options, { headers, credentials: "same-origin" }));
  const body = await response.json().catch(() => ({}));
  if (started !== generation) throw new Stale("another page was asked for meanwhile");
  if (!response.ok) {
    const err = new Error(body.error || response.statusText);
    err.status = response.status;
    err.type = body.type;
    throw err;
  }
  return body;
}

function errorBox(err) {
  return h("div", { class: "error-box", role: "alert" }, (err.type ? err.type + ": " : "") + err.message);
}

function show(title, ...content) {
  if (timer) { clearTimeout(timer); timer = null; }
  const heading = h("h1", { tabindex: "-1" }, title);
  main.replaceChildren(heading, ...content.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  document.title = title + " · aenv-ray";
  if (location.hash !== shown) { shown = location.hash; heading.focus(); }
}

function table(columns, rows, rowAttrs) {
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
    h("tbody", {}, rows.map((r, i) => h("tr", rowAttrs ? rowAttrs(r, i) : {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell(r)))))));
}

function cards(items) {
  return h("div", { class: "cards" }, items.map(([k, v, cls]) => h("div", { class: "card" }, h("div", { class: "v " + (cls || "") }, v), h("div", { class: "k" }, k))));
}

// Text that may be long: the start shown, the whole of it one click away (never dropped).
function longText(text, cls) {
  text = text === null || text === undefined ? "" : String(text);
  if (text.length <= FOLD) return h("pre", { class: cls }, text);
  return h("div", {},
    h("pre", { class: cls }, text.slice(0, FOLD)),
    h("details", {}, h("summary", { class: "folded" }, `show all ${text.length.toLocaleString()} characters (${(text.length - FOLD).toLocaleString()} more)`), h("pre", { class: cls }, text.slice(FOLD))));
}
function pretty(json) {
  if (typeof json !== "string") return JSON.stringify(json, null, 2);
  try { return JSON.stringify(JSON.parse(json), null, 2); } catch (e) { return json; }
}

let plotly = null;
function charts() {
  if (!plotly) {
    plotly = new Promise((resolve, reject) => {
      const s = h("script", { src: BASE + "/assets/plotly.min.js" });
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => reject(new Error("plotly.js did not load: install the 'ui' extra"));
      document.head.append(s);
    });
  }
  return plotly;
}
function chart(title, data, layout) {
  const div = h("div", { class: "chart", role: "img", "aria-label": title });
  charts().then((Plotly) => Plotly.newPlot(div, data, Object.assign({ title: { text: title, font: { size: 14 } }, margin: { t: 40, l: 50, r: 20, b: 60 }, height: 300 }, layout || {}), { displaylogo: false, responsive: true }));
  return div;
}

function navigation(current) {
  const links = HUB
    ? [["/envs", "Environments"], ["/instances", "Instances"], ["/runs", "Runs"], ["/compare", "Compare"], ["/login", "Key"]]
    : [["/runs", "Runs"], ["/compare", "Compare"]];
  document.getElementById("nav").replaceChildren(...links.map(([p, label]) => h("a", { href: "#" + p, "aria-current": current === p.split("/")[1] ? "page" : null }, label)));
}

// -- runs -----------------------------------------------------------------------------------------
function runName(name) { return name === "." ? "(this run)" : name; }
function setting(settings, ...keys) {
  for (const k of keys) {
    const v = k.split(".").reduce((o, p) => (o && typeof o === "object" ? o[p] : undefined), settings);
    if (v !== undefined && v !== null && v !== "") return typeof v === "object" ? JSON.stringify(v) : String(v);
  }
  return "–";
}

function stateBadge(s) {
  if (s.live) return h("span", { class: "badge live" }, "live");
  if (s.stalled) return h("span", { class: "badge stalled", title: "its driver has not posted for a minute" }, "stalled");
  return h("span", { class: "badge" }, "finished");
}

async function runsPage() {
  const data = await api(API + "/runs");
  const rows = data.runs;
  const choose = (id, label, chosen) => h("label", {}, label, h("select", { id }, rows.map((r) => h("option", { value: r.name, selected: r.name === chosen }, runName(r.name)))));
  const compareForm = rows.length >= 2 ? h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go("/compare", new URLSearchParams({ a: document.getElementById("cmp-a").value, b: document.getElementById("cmp-b").value })); } },
    choose("cmp-a", "Run A", rows[0].name), choose("cmp-b", "Run B", rows[1].name), h("button", { type: "submit" }, "Compare")) : null;
  show(`Runs in ${data.root}`,
    table([
      { label: "Run", cell: (r) => h("a", { href: "#/run/" + enc(r.name) }, runName(r.name)) },
      { label: "State", cell: (r) => stateBadge(r.summary) },
      { label: "Environment", cell: (r) => setting(r.settings, "env", "environment", "env_ref") },
      { label: "Policy / model", cell: (r) => setting(r.settings, "policy.model", "model", "policy") },
      { label: "Tasks", cell: (r) => setting(r.settings, "tasks") },
      { label: "Episodes", num: true, cell: (r) => fmt(r.summary.episodes) },
      { label: "OK", num: true, cell: (r) => h("span", { class: "ok" }, fmt(r.summary.ok || 0)) },
      { label: "Failed", num: true, cell: (r) => h("span", { class: r.summary.failed ? "bad" : "" }, fmt(r.summary.failed || 0)) },
      { label: "Retried", num: true, cell: (r) => fmt(r.summary.retried || 0) },
      { label: "Mean reward", num: true, cell: (r) => fmt(r.summary.mean_reward) },
      { label: "Episodes/s", num: true, cell: (r) => fmt(r.summary.episodes_per_second, 2) },
    ], rows),
    rows.length ? null : h("p", {}, HUB ? "No run of your tenant on this hub yet: `aenv rollout ENV` with this hub configured (AENV_SYSTEM_URL) sends its run here." : "No run here yet: `aenv rollout ENV --out DIR` writes one."),
    compareForm ? h("h2", {}, "Compare two runs") : null, compareForm);
  if (rows.some((r) => r.summary.live)) timer = setTimeout(() => refresh(), 2000);
}

function settingsList(settings) {
  const flat = [];
  const walk = (prefix, v) => {
    if (v && typeof v === "object" && !Array.isArray(v)) for (const [k, x] of Object.entries(v)) walk(prefix ? prefix + "." + k : k, x);
    else flat.push([prefix, Array.isArray(v) ? JSON.stringify(v) : String(v)]);
  };
  walk("", settings);
  return h("dl", { class: "settings" }, flat.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function runTabs(name, current) {
  return h("nav", { class: "pager", "aria-label": "Run" },
    [["", "Overview"], ["/rewards", "Rewards"], ["/episodes", "Episodes"]].map(([p, label]) =>
      h("a", { href: "#/run/" + enc(name) + p, "aria-current": current === label ? "page" : null }, label)));
}

async function runPage(name) {
  const run = await api(API + "/runs/" + enc(name));
  const s = run.summary;
  show(`Run ${runName(name)}`, runTabs(name, "Overview"),
    cards([
      ["state", s.live ? "live" : s.stalled ? "stalled" : "finished", s.live ? "ok" : s.stalled ? "warn" : ""],
      ["episodes", fmt(s.episodes)],
      ["ok", fmt(s.ok || 0), "ok"],
      ["failed", fmt(s.failed || 0), s.failed ? "bad" : ""],
      ["retried", fmt(s.retried || 0)],
      ["episodes/s", fmt(s.episodes_per_second, 2)],
      ["mean reward", fmt(s.mean_reward)],
      ["tasks", fmt(s.tasks)],
      ["tokens", fmt(s.tokens)],
    ]),
    h("h2", {}, "Ends by kind"),
    table([
      { label: "Kind", cell: (r) => h("a", { href: `#/run/${enc(name)}/episodes?kind=${enc(r.kind)}`, class: r.kind === "ok" ? "ok" : "bad" }, r.kind) },
      { label: "Outcome", cell: (r) => r.outcome },
      { label: "Episodes", num: true, cell: (r) => fmt(r.n) },
    ], s.by_kind),
    s.retries.length ? [h("h2", {}, "Retried attempts by kind"), table([{ label: "Kind", cell: (r) => r.kind }, { label: "Attempts", num: true, cell: (r) => fmt(r.n) }], s.retries)] : null,
    s.driver ? [h("h2", {}, "Driver"), settingsList(s.driver)] : null,
    h("h2", {}, "Settings (run.json)"), settingsList(run.settings));
  if (s.live) timer = setTimeout(() => refresh(), 2000);
}

async function rewardsPage(name, query) {
  const run = await api(API + "/runs/" + enc(name));
  const task = query.get("task") || "";
  const passing = query.get("passing") || "1";
  const r = await api(API + `/runs/${enc(name)}/rewards?` + new URLSearchParams({ task, passing }));
  const form = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go(`/run/${enc(name)}/rewards`, new URLSearchParams({ task: form.task.value, passing: form.passing.value })); } },
    h("label", {}, "Task", h("select", { name: "task" }, h("option", { value: "" }, "all tasks"), run.tasks.map((t) => h("option", { value: t, selected: t === task }, t)))),
    h("label", {}, "Passing reward ≥", h("input", { name: "passing", type: "number", step: "any", value: passing, size: 6 })),
    h("button", { type: "submit" }, "Show"));
  const rewards = r.histogram.filter((b) => b.reward !== null);
  const items = [
    chart("Reward distribution", [{ type: "bar", x: rewards.map((b) => b.reward), y: rewards.map((b) => b.n), name: "episodes" }], { xaxis: { title: { text: "reward" } }, yaxis: { title: { text: "episodes" } } }),
    chart("Ends by kind", [{ type: "bar", x: r.kinds.map((k) => k.kind), y: r.kinds.map((k) => k.n), marker: { color: r.kinds.map((k) => (k.kind === "ok" ? "#17803d" : "#b42318")) } }]),
    chart("Latency per tool (s)", [
      { type: "bar", name: "p50", x: r.tools.map((t) => t.tool), y: r.tools.map((t) => t.p50_seconds) },
      { type: "bar", name: "p95", x: r.tools.map((t) => t.tool), y: r.tools.map((t) => t.p95_seconds) }]),
    chart("Latency per turn (s)", [
      { type: "scatter", mode: "lines+markers", name: "p50", x: r.turns.map((t) => t.turn + 1), y: r.turns.map((t) => t.p50_seconds) },
      { type: "scatter", mode: "lines+markers", name: "p95", x: r.turns.map((t) => t.turn + 1), y: r.turns.map((t) => t.p95_seconds) }], { xaxis: { title: { text: "turn" }, dtick: 1 } }),
  ];
  if (!task && r.tasks.length) items.push(chart("Pass rate per task", [{ type: "bar", x: r.tasks.map((t) => t.task_id), y: r.tasks.map((t) => t.pass_rate) }], { yaxis: { range: [0, 1], tickformat: ".0%" } }));
  show(`Rewards of ${runName(name)}` + (task ? ` · task ${task}` : ""), runTabs(name, "Rewards"), form,
    cards([["episodes", fmt(r.episodes)], ["pass rate", pct(r.pass_rate), ""], ["failed", fmt(r.kinds.filter((k) => k.kind !== "ok").reduce((a, k) => a + k.n, 0))]]),
    h("div", { class: "charts" }, items),
    h("h2", {}, "Tools"),
    table([
      { label: "Tool", cell: (t) => h("a", { href: `#/run/${enc(name)}/episodes?tool=${enc(t.tool)}` }, t.tool) },
      { label: "Calls", num: true, cell: (t) => fmt(t.calls) },
      { label: "Errors", num: true, cell: (t) => h("span", { class: t.errors ? "bad" : "" }, fmt(t.errors || 0)) },
      { label: "Mean", num: true, cell: (t) => secs(t.mean_seconds) },
      { label: "p50", num: true, cell: (t) => secs(t.p50_seconds) },
      { label: "p95", num: true, cell: (t) => secs(t.p95_seconds) },
    ], r.tools),
    h("h2", {}, "Turns"),
    table([
      { label: "Turn", num: true, cell: (t) => t.turn + 1 },
      { label: "Episodes", num: true, cell: (t) => fmt(t.n) },
      { label: "p50", num: true, cell: (t) => secs(t.p50_seconds) },
      { label: "p95", num: true, cell: (t) => secs(t.p95_seconds) },
      { label: "Mean tokens", num: true, cell: (t) => fmt(t.mean_tokens, 0) },
    ], r.turns),
    r.tasks.length ? [h("h2", {}, "Per task"), table([
      { label: "Task", cell: (t) => h("a", { href: `#/run/${enc(name)}/rewards?` + new URLSearchParams({ task: t.task_id, passing }) }, t.task_id) },
      { label: "Episodes", num: true, cell: (t) => fmt(t.episodes) },
      { label: "Mean reward", num: true, cell: (t) => fmt(t.mean_reward) },
      { label: "Pass rate", num: true, cell: (t) => pct(t.pass_rate) },
      { label: "Failed", num: true, cell: (t) => h("a", { href: `#/run/${enc(name)}/episodes?` + new URLSearchParams({ task: t.task_id, kind: "failed" }) }, fmt(t.failed || 0)) },
      { label: "Mean time", num: true, cell: (t) => secs(t.mean_seconds) },
    ], r.tasks)] : null);
}

const FILTERS = ["task", "kind", "tool", "min_reward", "max_reward", "q", "errors", "sort"];

async function episodesPage(name, query) {
  const run = await api(API + "/runs/" + enc(name));
  const offset = Number(query.get("offset") || 0);
  const limit = 50;
  const params = new URLSearchParams();
  for (const k of FILTERS) if (query.get(k)) params.set(k, query.get(k));
  const page = await api(API + `/runs/${enc(name)}/episodes?` + params + `&offset=${offset}&limit=${limit}`);
  const select = (label, key, values, empty) => h("label", {}, label, h("select", { name: key }, h("option", { value: "" }, empty), values.map((v) => h("option", { value: v, selected: query.get(key) === v }, v))));
  const form = h("form", { class: "filters", "aria-label": "Filters", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const k of FILTERS) { const el = form.elements[k]; const v = el.type === "checkbox" ? (el.checked ? "1" : "") : el.value; if (v) q.set(k, v); }
    go(`/run/${enc(name)}/episodes`, q);
  } },
    select("Task", "task", run.tasks, "any task"),
    select("End", "kind", ["ok", "failed", ...run.kinds.filter((k) => k !== "ok")], "any end"),
    select("Tool", "tool", run.tools, "any tool"),
    h("label", {}, "Reward ≥", h("input", { name: "min_reward", type: "number", step: "any", size: 6, value: query.get("min_reward") || "" })),
    h("label", {}, "Reward ≤", h("input", { name: "max_reward", type: "number", step: "any", size: 6, value: query.get("max_reward") || "" })),
    h("label", {}, "Search", h("input", { name: "q", type: "search", placeholder: "id, task, reason", value: query.get("q") || "" })),
    h("label", {}, "Tool errors only", h("input", { name: "errors", type: "checkbox", checked: query.get("errors") === "1" })),
    h("label", {}, "Sort", h("select", { name: "sort" }, [["arrival", "as recorded"], ["-reward", "reward, high first"], ["reward", "reward, low first"], ["-seconds", "slowest first"], ["task", "task"]].map(([v, l]) => h("option", { value: v, selected: (query.get("sort") || "arrival") === v }, l)))),
    h("button", { type: "submit" }, "Filter"));
  const moved = (delta) => { const q = new URLSearchParams(params); q.set("offset", String(Math.max(0, offset + delta))); return `#/run/${enc(name)}/episodes?` + q; };
  const pager = h("div", { class: "pager" },
    offset > 0 ? h("a", { href: moved(-limit) }, "← previous") : null,
    h("span", {}, page.total ? `${offset + 1}–${Math.min(offset + limit, page.total)} of ${page.total.toLocaleString()}` : "no episode matches"),
    offset + limit < page.total ? h("a", { href: moved(limit) }, "next →") : null);
  show(`Episodes of ${runName(name)}`, runTabs(name, "Episodes"), form, pager,
    table([
      { label: "Episode", cell: (e) => h("a", { href: `#/run/${enc(name)}/episode/${enc(e.episode_id)}` }, e.episode_id) },
      { label: "Task", cell: (e) => e.task_id },
      { label: "End", cell: (e) => h("span", { class: e.kind === "ok" ? "ok" : "bad", title: e.reason }, e.kind) },
      { label: "Reward", num: true, cell: (e) => fmt(e.reward) },
      { label: "Turns", num: true, cell: (e) => fmt(e.turns) },
      { label: "Tool calls", num: true, cell: (e) => fmt(e.steps) },
      { label: "Tool errors", num: true, cell: (e) => h("span", { class: e.errors ? "bad" : "" }, fmt(e.errors)) },
      { label: "Time", num: true, cell: (e) => secs(e.seconds) },
      { label: "Tokens", num: true, cell: (e) => fmt(e.tokens) },
      { label: "Tools", cell: (e) => e.tools.join(", ") },
    ], page.episodes), pager);
}

// -- one episode as a conversation ------------------------------------------------------------------
async function episodePage(name, id) {
  const r = await api(API + `/runs/${enc(name)}/episodes/${enc(id)}`);
  const steps = {};
  for (const s of r.steps || []) if (s.tool_call_id) steps[s.tool_call_id] = s;
  const turns = {};
  (r.turns || []).forEach((t, i) => { turns[t.message_index] = Object.assign({ n: i + 1 }, t); });
  const toolName = {};
  for (const t of r.tool_names || []) toolName[t.name] = t.tool;
  const ok = r.outcome === "ok";
  const messages = (r.messages || []).map((m, i) => {
    const turn = turns[i];
    const step = m.role === "tool" ? steps[m.tool_call_id] : null;
    const failed = step && step.is_error;
    const meta = [];
    if (turn) meta.push(`turn ${turn.n}`, secs(turn.seconds), turn.usage ? `${turn.usage.prompt_tokens} prompt + ${turn.usage.completion_tokens} completion tokens` : null, turn.finish_reason ? `finish: ${turn.finish_reason}` : null);
    if (step) meta.push(step.tool, secs(step.seconds), failed ? "error" : null);
    return h("section", { class: `msg ${m.role}` + (failed ? " error" : ""), id: `m${i}`, "aria-label": `${m.role} message ${i + 1}` },
      h("span", { class: "who" }, m.role + (m.name ? ` (${m.name})` : "")),
      h("span", { class: "meta" }, meta.filter(Boolean).join(" · ")),
      m.content !== null && m.content !== undefined && m.content !== "" ? longText(m.role === "tool" ? pretty(m.content) : m.content) : null,
      m.extra ? h("details", {}, h("summary", { class: "folded" }, "more fields"), longText(pretty(m.extra))) : null,
      (m.tool_calls || []).map((c) => {
        const s = steps[c.id];
        const real = toolName[c.function.name] || (s && s.tool) || c.function.name;
        return h("details", { class: "call" + (s && s.is_error ? " error" : ""), id: "call-" + c.id },
          h("summary", {}, `tool call ${real}`, s ? ` · ${secs(s.seconds)}` : "", s && s.is_error ? " · error" : "", c.id ? ` · ${c.id}` : ""),
          h("div", {}, h("strong", {}, "arguments"), longText(pretty(c.function.arguments))),
          s ? h("div", {}, h("strong", { class: s.is_error ? "bad" : "" }, s.is_error ? "result (error)" : "result"), longText(s.structured_json ? pretty(s.structured_json) : s.text)) : h("p", { class: "folded" }, "no result recorded for this call"));
      }));
  });
  const timings = r.timings || {};
  show(`Episode ${r.episode_id}`,
    h("p", {}, h("a", { href: `#/run/${enc(name)}/episodes?task=${enc(r.task_id || "")}` }, `← episodes of task ${r.task_id}`), " · ", h("a", { href: location.hash, id: "permalink" }, "permalink")),
    cards([
      ["task", r.task_id || "–"],
      ["end", ok ? "ok" : r.outcome, ok ? "ok" : "bad"],
      ["reward", fmt(r.reward)],
      ["turns", fmt((r.turns || []).length)],
      ["tool calls", fmt((r.steps || []).length)],
      ["time", secs(r.seconds)],
      ["tokens", fmt(r.usage && r.usage.total_tokens)],
      ["attempts", fmt(r.attempts)],
    ]),
    r.reason ? h("div", { class: "error-box" }, h("strong", {}, "Why it ended: "), longText(r.reason)) : null,
    (r.retried || []).length ? [h("h2", {}, "Earlier attempts (retried)"), h("ul", {}, r.retried.map((x) => h("li", {}, String(x))))] : null,
    h("h2", {}, "Conversation"),
    messages.length ? messages : h("p", {}, "This record has no conversation (a policy without messages)."),
    r.answer !== null && r.answer !== undefined ? [h("h2", {}, "Answer"), longText(r.answer)] : null,
    h("h2", {}, "Reward"),
    settingsList(Object.assign({ reward: r.reward, truncated: r.truncated }, r.reward_components ? { components: r.reward_components } : {})),
    h("h2", {}, "Timings (s)"), settingsList(timings),
    h("h2", {}, "Task"), longText(pretty(r.task)),
    h("h2", {}, "Policy"), settingsList(r.policy || {}));
}

// -- two runs side by side --------------------------------------------------------------------------
async function comparePage(query) {
  const a = query.get("a"), b = query.get("b");
  if (!a || !b) {
    const runs = (await api(API + "/runs")).runs;
    const form = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go("/compare", new URLSearchParams({ a: form.a.value, b: form.b.value })); } },
      h("label", {}, "Run A (before)", h("select", { name: "a" }, runs.map((r) => h("option", { value: r.name }, runName(r.name))))),
      h("label", {}, "Run B (after)", h("select", { name: "b" }, runs.map((r, i) => h("option", { value: r.name, selected: i === 1 }, runName(r.name))))),
      h("button", { type: "submit" }, "Compare"));
    show("Compare two runs", form);
    return;
  }
  const c = await api(API + "/compare?" + new URLSearchParams({ a, b }));
  const both = c.tasks.filter((t) => t.delta !== null);
  show(`${runName(a)} → ${runName(b)}`,
    cards([
      ["better", fmt(c.counts.better), "ok"], ["worse", fmt(c.counts.worse), c.counts.worse ? "bad" : ""], ["same", fmt(c.counts.same)],
      ["only in A", fmt(c.counts["only in A"])], ["only in B", fmt(c.counts["only in B"])],
      ["mean reward A", fmt(c.a.mean_reward)], ["mean reward B", fmt(c.b.mean_reward)],
      ["failed A", fmt(c.a.failed || 0)], ["failed B", fmt(c.b.failed || 0)],
    ]),
    h("div", { class: "charts" },
      chart("Mean reward per task: B − A", [{ type: "bar", x: both.map((t) => t.task_id), y: both.map((t) => t.delta), marker: { color: both.map((t) => (t.delta > 0 ? "#17803d" : t.delta < 0 ? "#b42318" : "#98a2b3")) } }]),
      chart("Pass rate per task", [
        { type: "bar", name: runName(a), x: both.map((t) => t.task_id), y: both.map((t) => t.a.pass_rate) },
        { type: "bar", name: runName(b), x: both.map((t) => t.task_id), y: both.map((t) => t.b.pass_rate) }], { yaxis: { range: [0, 1], tickformat: ".0%" } })),
    h("h2", {}, "Per task"),
    table([
      { label: "Task", cell: (t) => t.task_id },
      { label: "Verdict", cell: (t) => h("span", { class: "verdict-" + t.verdict }, t.verdict) },
      { label: "Mean reward A", num: true, cell: (t) => (t.a ? h("a", { href: `#/run/${enc(a)}/episodes?task=${enc(t.task_id)}` }, fmt(t.a.mean_reward)) : "–") },
      { label: "Mean reward B", num: true, cell: (t) => (t.b ? h("a", { href: `#/run/${enc(b)}/episodes?task=${enc(t.task_id)}` }, fmt(t.b.mean_reward)) : "–") },
      { label: "Δ", num: true, cell: (t) => (t.delta === null ? "–" : (t.delta > 0 ? "+" : "") + fmt(t.delta)) },
      { label: "Pass A", num: true, cell: (t) => pct(t.a && t.a.pass_rate) },
      { label: "Pass B", num: true, cell: (t) => pct(t.b && t.b.pass_rate) },
      { label: "Failed A", num: true, cell: (t) => fmt(t.a && t.a.failed) },
      { label: "Failed B", num: true, cell: (t) => fmt(t.b && t.b.failed) },
    ], c.tasks));
}

// -- the hub's page: environments, instances, services ---------------------------------------------
async function loginPage() {
  let who = null;
  try { who = sessionStorage.getItem("aenv-hub-key") ? await api("/v1/whoami") : null; } catch (e) { who = null; }
  const form = h("form", { class: "filters", onsubmit: async (e) => {
    e.preventDefault();
    sessionStorage.setItem("aenv-hub-key", form.key.value.trim());
    sessionStorage.removeItem("aenv-hub-no-key");
    try { await api("/v1/whoami"); go("/envs"); } catch (err) { sessionStorage.removeItem("aenv-hub-key"); form.after(errorBox(err)); }
  } },
    h("label", {}, "API key (kept in this tab only)", h("input", { name: "key", type: "password", size: 50, autocomplete: "off", placeholder: "aenv_..." })),
    h("button", { type: "submit" }, "Use this key"),
    h("button", { type: "button", onclick: () => { sessionStorage.removeItem("aenv-hub-key"); sessionStorage.setItem("aenv-hub-no-key", "1"); go("/envs"); } }, "This hub needs no key"));
  show("Hub key", who ? h("p", {}, `Signed in as tenant ${who.tenant}` + (who.key_id ? ` (key ${who.key_id})` : "")) : h("p", {}, "This hub's API applies your key's tenant: paste a key `aenv keys create` printed (a hub started with --no-auth needs none)."), form);
}

async function whoami() {
  if (!sessionStorage.getItem("aenv-hub-key") && !sessionStorage.getItem("aenv-hub-no-key")) { go("/login"); return null; }
  try { return await api("/v1/whoami"); } catch (err) { if (err.status === 401 || err.status === 403) { go("/login"); return null; } throw err; }
}

async function envsPage(query) {
  if (!(await whoami())) return;
  const q = query.get("q") || "";
  const data = await api("/v1/envs?" + new URLSearchParams({ q }));
  const form = h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); go("/envs", new URLSearchParams({ q: form.q.value })); } },
    h("label", {}, "Search", h("input", { name: "q", type: "search", value: q })), h("button", { type: "submit" }, "Search"));
  show("Environments", form, table([
    { label: "Name", cell: (e) => h("a", { href: "#/env/" + enc(e.name) }, e.name) },
    { label: "Latest", cell: (e) => e.latest || e.version || "–" },
    { label: "Description", cell: (e) => e.description || "" },
    { label: "Tags", cell: (e) => (e.tags || []).join(", ") },
    { label: "Publisher", cell: (e) => e.publisher || "" },
  ], data.environments));
}

async function envPage(name, version) {
  if (!(await whoami())) return;
  const versions = (await api("/v1/envs/" + enc(name))).versions;
  const chosen = version || (versions.length ? versions[versions.length - 1].version : "latest");
  const v = await api(`/v1/envs/${enc(name)}/${enc(chosen)}`);
  const calls = v.calls || {};
  const functions = calls.functions || [];
  const tools = calls.tools || [];
  const readme = h("div", {}, h("p", { class: "folded" }, "reading README from the bundle…"));
  show(`${v.name}@${v.version}`,
    h("nav", { class: "pager", "aria-label": "Versions" }, "Versions: ", versions.map((x) => h("a", { href: `#/env/${enc(name)}/${enc(x.version)}`, "aria-current": x.version === v.version ? "page" : null }, x.version + (x.deprecated ? " (deprecated)" : "")))),
    settingsList({ ref: v.ref, digest: v.digest, size: v.size, publisher: v.publisher, published: new Date(v.published_at * 1000).toISOString(), tags: v.tags, deprecated: v.deprecated }),
    v.description ? h("p", {}, v.description) : null,
    h("h2", {}, "Tools"),
    tools.length ? h("div", { class: "tools" }, tools.map(schemaForm)) : h("p", {}, !v.calls ? "The hub has no schemas of this version's calls (it was published before the hub load-checked versions)." : calls.tools ? "This version registers no tools." : "The hub has no schemas of this version's tools (it was published before the hub stored them)."),
    h("h2", {}, "Functions"),
    functions.length ? h("div", { class: "functions" }, functions.map(schemaForm)) : h("p", {}, v.calls ? "This version registers no functions." : "–"),
    calls.reward ? [h("h3", {}, "Reward"), schemaForm(calls.reward)] : null,
    h("h2", {}, "README"), readme,
    h("h2", {}, "Config"), longText(JSON.stringify(v.config, null, 2)));
  bundleReadme(`/v1/envs/${enc(name)}/${enc(v.version)}/bundle`).then((text) => readme.replaceChildren(text ? longText(text) : h("p", {}, "The bundle has no README."))).catch((err) => readme.replaceChildren(errorBox(err)));
}

// One call's inputSchema as a form (what it takes, typed): a view, nothing is sent.
function schemaForm(call) {
  const schema = call.inputSchema || call.input_schema || call.parameters || {};
  const required = new Set(schema.required || []);
  const field = (key, prop) => {
    const type = prop.type || (prop.enum ? "enum" : "any");
    const input = prop.enum
      ? h("select", { name: key, disabled: true }, prop.enum.map((x) => h("option", {}, String(x))))
      : h("input", { name: key, disabled: true, type: type === "integer" || type === "number" ? "number" : type === "boolean" ? "checkbox" : "text", placeholder: prop.default !== undefined ? String(prop.default) : type });
    return h("label", {}, `${key}${required.has(key) ? " *" : ""} `, input, h("span", { class: "folded" }, ` ${type}${prop.description ? " — " + prop.description : ""}`));
  };
  return h("form", { class: "schema-form", onsubmit: (e) => e.preventDefault() },
    h("fieldset", {}, h("legend", {}, call.name || "call"), call.description ? h("p", {}, call.description) : null,
      Object.entries(schema.properties || {}).map(([k, p]) => field(k, p || {}))));
}

// The README of a bundle (a gzip tar): unpacked in the browser, nothing stored.
async function bundleReadme(path) {
  const key = sessionStorage.getItem("aenv-hub-key");
  const response = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
  if (!response.ok) throw new Error(`the bundle could not be read (HTTP ${response.status})`);
  const tar = new Uint8Array(await new Response(response.body.pipeThrough(new DecompressionStream("gzip"))).arrayBuffer());
  const text = new TextDecoder();
  for (let at = 0; at + 512 <= tar.length;) {
    const header = tar.subarray(at, at + 512);
    const name = text.decode(header.subarray(0, 100)).replace(/\0.*$/s, "");
    if (!name) break;
    const size = parseInt(text.decode(header.subarray(124, 136)).replace(/\0.*$/s, "").trim() || "0", 8);
    const base = name.replace(/^\.\//, "");
    if (/^readme(\.md|\.txt|\.rst)?$/i.test(base)) return text.decode(tar.subarray(at + 512, at + 512 + size));
    at += 512 + Math.ceil(size / 512) * 512;
  }
  return null;
}

async function instancesPage() {
  const me = await whoami();
  if (!me) return;
  const [instances, services] = await Promise.all([api("/v1/instances"), api("/v1/services")]);
  const now = Date.now() / 1000;
  const act = (label, cls, fn) => h("button", { type: "button", class: cls, onclick: async (e) => {
    e.target.disabled = true;
    try { await fn(); await refresh(); status(label + ": done"); } catch (err) { e.target.after(errorBox(err)); e.target.disabled = false; }
  } }, label);
  show("Instances and services",
    h("p", {}, `Tenant ${me.tenant}: you may delete or renew your tenant's instances only.`),
    table([
      { label: "Instance", cell: (i) => i.id },
      { label: "Environment", cell: (i) => i.env_ref },
      { label: "State", cell: (i) => h("span", { class: i.state === "running" ? "ok" : i.state === "terminated" ? "bad" : "warn" }, i.state) },
      { label: "TTL left", num: true, cell: (i) => (i.expires_at ? secs(Math.max(0, i.expires_at - now)) : "none") },
      { label: "Owner", cell: (i) => i.owner || "" },
      { label: "Tenant", cell: (i) => i.tenant },
      { label: "Service", cell: (i) => i.service || "" },
      { label: "Actions", cell: (i) => (i.tenant === me.tenant && i.state !== "terminated"
        ? [act("Renew 30m", "", () => api(`/v1/instances/${enc(i.id)}/renew`, { method: "POST", body: JSON.stringify({ ttl: "30m" }) })), " ",
           act("Delete", "danger", () => api(`/v1/instances/${enc(i.id)}`, { method: "DELETE" }))]
        : "") },
    ], instances.instances),
    instances.instances.length ? null : h("p", {}, "No instance of your tenant is running."),
    h("h2", {}, "Services"),
    table([
      { label: "Service", cell: (s) => s.name || s.id },
      { label: "Environment", cell: (s) => s.env_ref },
      { label: "Replicas", num: true, cell: (s) => `${s.ready}/${s.replicas}` },
      { label: "Storage", cell: (s) => s.storage || "" },
      { label: "Detail", cell: (s) => s.detail || "" },
    ], services.services || []));
}

// -- routing ------------------------------------------------------------------------------------------
async function refresh() {
  if (timer) { clearTimeout(timer); timer = null; }
  generation += 1;
  const { parts, query } = parseHash();
  navigation(parts[0] === "run" ? "runs" : parts[0] === "env" ? "envs" : parts[0]);
  status("");
  try {
    if (HUB && parts[0] === "login") await loginPage();
    else if (HUB && parts[0] === "env" && parts[1]) await envPage(parts[1], parts[2]);
    else if (HUB && parts[0] === "instances") await instancesPage();
    else if (HUB && !["run", "runs", "compare"].includes(parts[0])) await envsPage(query);
    else if (HUB && !(await whoami())) return;
    else if (parts[0] === "run" && parts[1] !== undefined) {
      if (parts[2] === "rewards") await rewardsPage(parts[1], query);
      else if (parts[2] === "episodes") await episodesPage(parts[1], query);
      else if (parts[2] === "episode" && parts[3]) await episodePage(parts[1], parts[3]);
      else await runPage(parts[1]);
    } else if (parts[0] === "compare") await comparePage(query);
    else await runsPage();
  } catch (err) {
    if (err instanceof Stale) return; // a newer render is under way
    show("Something went wrong", errorBox(err));
  }
}

window.addEventListener("hashchange", refresh);
refresh();

// The Conveyor dashboard: polls the JSON endpoints every second and redraws. Everything from the
// servers goes in as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const DEAD_PAGE = 50;
let selected = null;          // the queue whose detail is open
let deadCursor = "";          // where the next page of its dead letters starts
let lastOverview = null;
let deadRequest = 0;          // the latest request for dead letters: an answer to an older one is dropped
let openTask = null;          // the id (shard:n) of the task whose page is open, in the selected queue
let tasksRequest = 0;         // the latest request for the task list, and for the task's page: older answers dropped
let taskRequest = 0;
let tasksBusy = false, taskBusy = false;  // the page's cycle asks again only once the last answer came
const TASK_PAGE = 50;         // running and recent tasks shown, each
// internal queues (a Spark job's records) shown too: kept in the URL (?internal=1), so a reload or a link keeps it
let showInternal = new URLSearchParams(window.location.search).get("internal") === "1";

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(n) { return typeof n === "number" ? n.toLocaleString("en-US") : "–"; }
function rate(n) { return typeof n === "number" ? n.toLocaleString("en-US", {maximumFractionDigits: 1}) : "–"; }
function bytes(n) {
  if (typeof n !== "number") return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function ago(s) { return s === null || s === undefined ? "–" : s < 1 ? "now" : s.toFixed(0) + " s ago"; }
function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 90) return s.toFixed(0) + " s";
  if (s < 5400) return (s / 60).toFixed(0) + " min";
  return (s / 3600).toFixed(1) + " h";
}

async function api(path, options) {
  const r = await fetch(path, Object.assign({credentials: "same-origin"}, options || {}));
  if (r.status === 401) { window.location = "/login"; throw new Error("log in first"); }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const c of cells) tr.append(c instanceof Node ? c : el("td", c));
  return tr;
}

// "partial: 1 of 3 servers unreachable (host:port)", or null when every server answers
function partialText(p) {
  return p ? "partial: " + p.unreachable.length + " of " + p.servers + " servers unreachable (" +
    p.unreachable.join(", ") + ")" : null;
}

function drawPartial(p) {
  const text = partialText(p);
  const badge = document.getElementById("partial");
  badge.hidden = text === null;
  badge.textContent = text || "";
  badge.title = text ? "every total and chart counts only the servers that answer; " +
    "a queue's breakdown keeps the last figures of those down, greyed" : "";
  for (const mark of document.querySelectorAll(".partial-mark")) {
    mark.hidden = text === null;
    mark.title = text || "";
  }
}

function drawServers(servers) {
  const box = document.getElementById("servers");
  box.replaceChildren(...servers.map(s => {
    const chip = el("span", s.address + (s.up ? " up" : " DOWN"), "server " + (s.up ? "up" : "down"));
    chip.dataset.address = s.address;
    chip.title = s.up ? "answered " + ago(s.last_answer_s) : (s.error || "no answer") +
      (s.last_answer_s !== null ? " (last answer " + ago(s.last_answer_s) + ")" : "");
    return chip;
  }));
}

function queueCells(q) {
  return [num(q.ready), num(q.delivered), num(q.delayed), num(q.acked), num(q.failed), rate(q.put_rate),
          rate(q.ack_rate), bytes(q.bytes_on_disk)];
}

function drawQueues(queues, servers) {
  const shown = queues.filter(q => showInternal || !q.internal);
  const hidden = queues.length - shown.length;
  document.getElementById("queue-count").textContent = "(" + shown.length + (hidden ? ", " + hidden + " internal hidden" : "") + ")";
  const down = servers.filter(s => !s.up).map(s => s.address);
  fill(document.querySelector("#queues tbody"), shown.map(q => {
    const name = el("td", q.name);
    if (q.internal) name.append(el("span", "internal", "tag"));
    if (q.partial) name.append(el("span", "partial", "tag partial"));
    const tr = row([name, ...queueCells(q)], [q.name === selected ? "selected" : "", q.partial ? "partial" : ""].join(" ").trim());
    if (q.partial) tr.title = "counts of the servers that answer; not counted: " + down.join(", ") + " (down)";
    tr.dataset.queue = q.name;
    tr.addEventListener("click", () => openQueue(q.name));
    return tr;
  }));
}

function drawDetail(overview) {
  if (selected === null) return;
  const q = overview.queues.find(x => x.name === selected);
  const servers = overview.servers;
  fill(document.querySelector("#shards tbody"), servers.map(s => {
    const per = q && q.shards[String(s.shard)];
    if (s.up) return row([String(s.shard), s.address, ...(per ? queueCells(per) : Array(8).fill("–"))]);
    // down: its last answer's figures, greyed and dated, or said missing when it never answered
    const where = el("td", s.address + (per ? " (down; last known, " + ago(per.age_s) + ")" : " (down)"));
    const tr = row([String(s.shard), where, ...(per ? queueCells(per) : Array(8).fill(s.last_answer_s === null ? "missing" : "–"))],
                   per ? "down stale" : "down");
    tr.title = per ? "not counted in the totals: these are its figures when it last answered" : "no figures: it has not answered";
    return tr;
  }));
}

function drawJobs(jobs) {
  document.getElementById("job-count").textContent = "(" + jobs.length + ")";
  fill(document.querySelector("#jobs tbody"), jobs.map(j => {
    // in rows once its consumers have reported some; in messages until then
    const inRows = typeof j.rows_total === "number" && j.rows_total > 0;
    const part = inRows ? j.rows_done / j.rows_total : (j.total ? j.done / j.total : 0);
    const bar = el("span", null, "bar");
    const fillBar = el("span");
    fillBar.style.width = (100 * part).toFixed(1) + "%";
    bar.append(fillBar);
    const cell = el("td");
    cell.append(bar, el("span", " " + (100 * part).toFixed(0) + "%"));
    const tr = row([j.queue, cell, num(j.rows_done), num(j.rows_total), num(j.done), num(j.total), num(j.failed),
                    rate(inRows ? j.rows_rate : null), duration(j.eta_s)], j.partial ? "partial" : "");
    if (j.partial) tr.title = "counts of the servers that answer: some of its messages are on a server down";
    return tr;
  }));
}

function drawConsumers(consumers) {
  document.getElementById("consumer-count").textContent = "(" + consumers.length + ")";
  fill(document.querySelector("#consumers tbody"), consumers.map(c => {
    const tr = row([c.name, c.host, String(c.pid), num(c.processed), num(c.failed), num(c.running), num(c.stolen),
                    c.rate === null ? "–" : rate(c.rate), ago(c.seen), c.status], c.status);
    tr.dataset.consumer = c.name;
    return tr;
  }));
}

// Charts: hand-drawn SVG (no library: the page works offline under a strict CSP). Each has a time
// axis with clock ticks, a value axis with its unit, spans where some server was down shaded, and
// a readout of the values at the time under the pointer.
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_H = 170, MARGIN = {left: 56, right: 12, top: 10, bottom: 26};
const MIN_SPAN_S = 60;        // a chart spans at least this much time: a fresh dashboard's ticks stay readable
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
const charts = {};            // by svg id: what it drew last (for the readout), and where the pointer is

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function pad2(n) { return String(n).padStart(2, "0"); }
function clock(t, seconds) {
  const d = new Date(t * 1000);
  return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + (seconds ? ":" + pad2(d.getSeconds()) : "");
}
function tickValue(v) {
  if (v >= 1e6) return +(v / 1e6).toFixed(2) + "M";
  if (v >= 1e4) return +(v / 1e3).toFixed(1) + "k";
  return String(+v.toFixed(2));
}

// a step of 1, 2 or 5 times a power of ten giving at most `n` intervals up to `max`
function niceStep(max, n, integer) {
  const raw = max / n;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(x => x >= raw);
  return integer ? Math.max(1, Math.ceil(step)) : step;
}

function chart(svgId, h, series) {
  const svg = document.getElementById(svgId);
  const W = Math.max(svg.clientWidth || 600, 200), H = CHART_H;
  const left = MARGIN.left, right = W - MARGIN.right, top = MARGIN.top, bottom = H - MARGIN.bottom;
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  const unit = svg.dataset.unit, integer = svg.dataset.integer === "1";
  const times = h.time;
  const t1 = times.length ? times[times.length - 1] : Date.now() / 1000;
  const t0 = Math.min(times.length ? times[0] : t1, t1 - MIN_SPAN_S);
  const peak = Math.max(0, ...series.flatMap(s => s.values));
  const yStep = niceStep(peak > 0 ? peak : 1, 4, integer);
  const yMax = Math.max(yStep, Math.ceil(peak / yStep) * yStep);
  const x = t => left + (right - left) * (t - t0) / (t1 - t0);
  const y = v => bottom - (bottom - top) * v / yMax;
  const parts = [];
  // spans where some server was down: the sums lack its share
  for (let i = 0; i < times.length; i++) {
    if (!h.partial[i]) continue;
    let j = i;
    while (j + 1 < times.length && h.partial[j + 1]) j++;
    const a = x(times[Math.max(i - 1, 0)]), b = x(times[j]);
    parts.push(svgEl("rect", {class: "partial-span", x: a.toFixed(1), y: top, width: Math.max(b - a, 2).toFixed(1), height: bottom - top}));
    i = j;
  }
  // the value axis: grid lines and tick values, and the quantity's unit
  const yAxis = svgEl("g", {class: "axis y-axis"});
  for (let v = 0; v <= yMax + yStep / 2; v += yStep) {
    const yy = y(v).toFixed(1);
    yAxis.append(svgEl("line", {class: "grid", x1: left, x2: right, y1: yy, y2: yy}));
    const tick = svgEl("g", {class: "tick y-tick"});
    tick.append(svgEl("text", {x: left - 5, y: yy, "text-anchor": "end", "dominant-baseline": "middle"}, tickValue(v)));
    yAxis.append(tick);
  }
  const mid = (top + bottom) / 2;
  yAxis.append(svgEl("text", {class: "axis-label y-label", x: 11, y: mid, "text-anchor": "middle",
                              transform: "rotate(-90 11 " + mid + ")"}, unit));
  yAxis.append(svgEl("line", {class: "axis-line", x1: left, x2: left, y1: top, y2: bottom}));
  parts.push(yAxis);
  // the time axis: clock times at round steps
  const tStep = TIME_STEPS.find(st => (t1 - t0) / st <= Math.max(2, Math.floor((right - left) / 90))) || 3600;
  const xAxis = svgEl("g", {class: "axis x-axis"});
  xAxis.append(svgEl("line", {class: "axis-line", x1: left, x2: right, y1: bottom, y2: bottom}));
  for (let t = Math.ceil(t0 / tStep) * tStep; t <= t1; t += tStep) {
    const xx = x(t).toFixed(1);
    const tick = svgEl("g", {class: "tick x-tick"});
    tick.append(svgEl("line", {x1: xx, x2: xx, y1: bottom, y2: bottom + 4}));
    // a label at an edge is anchored inside the chart, not cut
    const anchor = x(t) + 24 > W ? "end" : x(t) - 24 < 0 ? "start" : "middle";
    tick.append(svgEl("text", {x: xx, y: bottom + 15, "text-anchor": anchor}, clock(t, tStep < 60)));
    xAxis.append(tick);
  }
  xAxis.append(svgEl("text", {class: "axis-label x-label", x: right, y: H - 1, "text-anchor": "end"}, "time"));
  parts.push(xAxis);
  for (const s of series) {
    if (!s.values.length) continue;
    parts.push(svgEl("path", {class: s.cls,
      d: s.values.map((v, i) => (i ? "L" : "M") + x(times[i]).toFixed(1) + "," + y(v).toFixed(1)).join("")}));
  }
  const cursor = svgEl("g", {class: "cursor"});
  parts.push(cursor);
  svg.replaceChildren(...parts);
  const c = charts[svgId] || (charts[svgId] = {pointer: null});
  Object.assign(c, {svg, W, left, right, x, y, times, series, partial: h.partial, unit, cursor, integer});
  showReadout(svgId);
}

// the sample nearest the pointer: its time and each series' value, beside a cursor line
function showReadout(svgId) {
  const c = charts[svgId];
  const out = document.getElementById(svgId + "-readout");
  if (!c || c.pointer === null || !c.times.length) {
    if (c) c.cursor.replaceChildren();
    out.hidden = true;
    return;
  }
  let best = 0;
  for (let i = 1; i < c.times.length; i++) {
    if (Math.abs(c.x(c.times[i]) - c.pointer) < Math.abs(c.x(c.times[best]) - c.pointer)) best = i;
  }
  const xx = c.x(c.times[best]);
  const marks = [svgEl("line", {x1: xx.toFixed(1), x2: xx.toFixed(1), y1: MARGIN.top, y2: CHART_H - MARGIN.bottom})];
  const words = [];
  for (const s of c.series) {
    const v = s.values[best];
    if (v === undefined) continue;
    marks.push(svgEl("circle", {class: s.cls, cx: xx.toFixed(1), cy: c.y(v).toFixed(1), r: 3}));
    const shown = c.integer ? num(v) : rate(v);
    words.push([s.name, shown, c.unit]);
  }
  c.cursor.replaceChildren(...marks);
  out.replaceChildren(el("span", clock(c.times[best], true), "time"),
                      ...words.map(([name, v, unit]) => el("span", name + " " + v + " " + unit, "value")));
  if (c.partial[best]) out.append(el("span", "partial: a server was down", "partial"));
  out.hidden = false;
  const box = c.svg.getBoundingClientRect();
  const px = xx * box.width / c.W;   // in the figure's pixels
  out.style.left = Math.max(0, Math.min(px + 12, box.width - out.offsetWidth)) + "px";
}

function watchPointer(svgId) {
  const svg = document.getElementById(svgId);
  svg.addEventListener("pointermove", e => {
    const c = charts[svgId];
    if (!c) return;
    const box = svg.getBoundingClientRect();
    const px = (e.clientX - box.left) * c.W / box.width;
    c.pointer = px >= c.left - 4 && px <= c.right + 4 ? px : null;
    showReadout(svgId);
  });
  svg.addEventListener("pointerleave", () => {
    if (charts[svgId]) charts[svgId].pointer = null;
    showReadout(svgId);
  });
}

async function refreshHistory() {
  const all = await api("/api/history" + (showInternal ? "?internal=1" : ""));
  chart("chart-rates", all, [{values: all.put_rate, cls: "put", name: "put"}, {values: all.ack_rate, cls: "ack", name: "ack"}]);
  chart("chart-ready", all, [{values: all.ready, cls: "ready", name: "ready"}]);
  if (selected !== null) {
    const one = await api("/api/history?queue=" + encodeURIComponent(selected));
    chart("chart-q-rates", one, [{values: one.put_rate, cls: "put", name: "put"}, {values: one.ack_rate, cls: "ack", name: "ack"}]);
    chart("chart-q-ready", one, [{values: one.ready, cls: "ready", name: "ready"}]);
  }
}

async function refresh() {
  try {
    const o = await api("/api/overview");
    lastOverview = o;
    drawServers(o.servers);
    drawPartial(o.partial);
    drawQueues(o.queues, o.servers);
    drawDetail(o);
    drawJobs(o.jobs);
    drawConsumers(o.consumers);
    await refreshHistory();
    // not awaited: a server slow to answer them slows no other part of the page; one at a time each
    if (!tasksBusy) { tasksBusy = true; loadTasks().finally(() => { tasksBusy = false; }); }
    if (!taskBusy) { taskBusy = true; loadTask().finally(() => { taskBusy = false; }); }
    const down = o.servers.filter(s => !s.up).length;
    document.getElementById("updated").textContent = "updated " + new Date(o.time * 1000).toLocaleTimeString() +
      (down ? " · " + down + " of " + o.servers.length + " servers down" : "");
    document.body.dataset.updated = String(o.time);
  } catch (e) {
    document.getElementById("updated").textContent = "dashboard unreachable: " + e.message;
  } finally {
    setTimeout(refresh, POLL_MS);
  }
}

// Tasks: a queue's running and recent tasks (asked for while its view is open, with the page's
// cycle), and one task's page at #/queue/<queue>/task/<id>, so it can be linked.
function clockOf(t) { return typeof t === "number" ? new Date(t * 1000).toLocaleTimeString() : "–"; }
function dateOf(t) { return typeof t === "number" ? new Date(t * 1000).toLocaleString() : "–"; }
function runtime(s) { return typeof s !== "number" ? "–" : s < 10 ? s.toFixed(2) + " s" : duration(s); }
function taskHash(queue, id) {  // an id's colon kept as typed (shard:n)
  return "#/queue/" + encodeURIComponent(queue) + (id ? "/task/" + encodeURIComponent(id).replace(/%3A/gi, ":") : "");
}

function errorCell(text, line) {
  // An error of several lines shows the line that names it (`line`, picked by the server), the whole
  // of it unfolded on a click.
  const td = el("td", null, "text");
  if ((text || "").trim().includes("\n")) {
    const det = el("details");
    det.append(el("summary", line), el("pre", text));
    td.append(det);
  } else {
    td.textContent = text || "";
  }
  return td;
}

function taskRow(t, recent) {
  const state = el("td", t.state, "state-" + t.state);
  const cells = [t.id, el("td", t.task, "text"), state, String(t.attempt), runtime(t.runtime_s), el("td", t.consumer || "–", "text"),
                 recent ? clockOf(t.finished_at) : clockOf(t.delivered_at)];
  if (recent) cells.push(errorCell(t.error, t.error_line));
  const tr = row(cells, t.id === openTask ? "selected" : "");
  tr.dataset.id = t.id;
  tr.addEventListener("click", () => { window.location.hash = taskHash(selected, t.id); });
  return tr;
}

function taskQuery() {
  const params = new URLSearchParams({queue: selected, limit: String(TASK_PAGE)});
  const name = document.getElementById("tasks-search").value.trim();
  const state = document.getElementById("tasks-state").value;
  const id = document.getElementById("tasks-id").value.trim();
  if (name) params.set("task", name);
  if (state) params.set("state", state);
  if (id) params.set("id", id);
  return params;
}

async function loadTasks() {
  if (selected === null) return;
  const mine = ++tasksRequest;
  const status = document.getElementById("tasks-status");
  const id = document.getElementById("tasks-id").value.trim();
  const open = document.getElementById("tasks-open");
  open.hidden = !id;
  open.textContent = "open task " + id;
  open.href = taskHash(selected, id);
  try {
    const page = await api("/api/tasks?" + taskQuery());
    if (mine !== tasksRequest) return;  // the queue or a filter changed meanwhile
    fill(document.querySelector("#running tbody"), page.running.map(t => taskRow(t, false)));
    fill(document.querySelector("#recent tbody"), page.recent.map(t => taskRow(t, true)));
    document.getElementById("running-count").textContent = "(" + page.running.length +
      (page.running_total > page.running.length ? " of " + page.running_total : "") + ")";
    document.getElementById("recent-count").textContent = "(" + page.recent.length + ")";
    const partial = document.getElementById("tasks-partial");
    const text = partialText(page.partial);
    partial.hidden = text === null;
    partial.textContent = text || "";
    partial.title = text ? "the tasks of the servers that answer; not shown: those of " + page.partial.unreachable.join(", ") : "";
    status.textContent = "";
  } catch (e) {
    if (mine === tasksRequest) status.textContent = "could not read the tasks: " + e.message;
  }
}

const STATUS_SAYS = {ready: "waiting to run, or delayed", delivered: "running, or about to",
                     acked: "finished", failed: "a dead letter"};

function fact(id, text) { document.getElementById(id).textContent = text; }

function drawTask(d) {
  fact("task-name", d.task || "(no task name)");
  fact("task-state", d.status === null ? "no such message in this queue on its server" : d.status + " (" + STATUS_SAYS[d.status] + ")" +
    (d.records.length ? " · " + d.records.length + (d.records.length > 1 ? " deliveries" : " delivery") + " recorded" : ""));
  fact("task-enqueued", dateOf(d.enqueued_at));
  fact("task-payload", d.payload ? d.payload.text : "not known (the server keeps it once the message is delivered, or a dead letter)");
  const error = d.error || [...d.records].reverse().map(r => r.error).find(e => e) || "";
  fact("task-result", d.result ? d.result.text : d.status === "acked" ? "not kept" : "–");
  fact("task-error", error || "–");
  fill(document.querySelector("#task-history tbody"), d.history.map(e => {
    return row([dateOf(e.at), el("td", e.what, "state-" + e.what), el("td", e.consumer || "–", "text"),
                e.attempt ? String(e.attempt) : "–", errorCell(e.error, e.error_line)]);
  }));
  fill(document.querySelector("#task-headers tbody"), Object.entries(d.headers || {}).map(([k, v]) => {
    const tr = el("tr");
    tr.append(el("th", k), el("td", v));
    return tr;
  }));
  document.getElementById("task-cancel").hidden = !d.cancellable;
}

async function loadTask() {
  if (selected === null || openTask === null) return;
  const mine = ++taskRequest;
  try {
    const d = await api("/api/task?" + new URLSearchParams({queue: selected, id: openTask}));
    if (mine !== taskRequest) return;
    drawTask(d);
    document.getElementById("task").dataset.loaded = d.id;
  } catch (e) {
    if (mine === taskRequest) fact("task-status", "could not read the task: " + e.message);
  }
}

function showTask(id) {
  openTask = id;
  const box = document.getElementById("task");
  box.hidden = id === null;
  for (const tr of document.querySelectorAll("#running tbody tr, #recent tbody tr")) tr.classList.toggle("selected", tr.dataset.id === id);
  if (id === null) return;
  if (box.dataset.loaded !== id) {  // another task's page: emptied until its own comes
    delete box.dataset.loaded;
    for (const f of ["task-name", "task-state", "task-enqueued", "task-payload", "task-result", "task-error", "task-status"]) fact(f, "");
    fill(document.querySelector("#task-history tbody"), []);
    fill(document.querySelector("#task-headers tbody"), []);
    document.getElementById("task-cancel").hidden = true;
  }
  fact("task-id", id);
  loadTask();
}

async function cancelTask() {
  const id = openTask, queue = selected;
  if (!window.confirm("Cancel task " + id + " of " + queue + "? It becomes a dead letter before it runs (requeue puts it back).")) return;
  try {
    const r = await api("/api/cancel", {method: "POST", headers: {"Content-Type": "application/json", "X-Conveyor": "1"},
                                        body: JSON.stringify({queue: queue, ids: [id]})});
    fact("task-status", r.outcomes[id] || "");
  } catch (e) {
    fact("task-status", "cancel failed: " + e.message);
  }
  await loadTask();
  await loadTasks();
}

// the view the URL names: #/queue/<queue>, or #/queue/<queue>/task/<id>
function route() {
  const m = /^#\/queue\/([^/]+)(?:\/task\/([^/]+))?$/.exec(window.location.hash);
  if (!m) return;
  let queue, id;
  try {
    queue = decodeURIComponent(m[1]);
    id = m[2] === undefined ? null : decodeURIComponent(m[2]);
  } catch (e) {  // a mangled link: no view
    return;
  }
  if (queue !== selected) openQueue(queue, false);
  showTask(id);
}

function deadRow(d) {
  const box = el("input");
  box.type = "checkbox";
  box.value = d.id;
  box.addEventListener("change", updateRequeueButton);
  const pick = el("td");
  pick.append(box);
  const tr = row([pick, d.id, String(d.attempts), new Date(d.failed_at * 1000).toLocaleString(),
                  el("td", d.task, "text"), errorCell(d.error, d.error_line), el("td", d.payload, "text")]);
  tr.dataset.id = d.id;
  return tr;
}

async function loadDead(more) {
  const tbody = document.querySelector("#dead tbody");
  const status = document.getElementById("dead-status");
  const moreButton = document.getElementById("dead-more");
  if (!more) { deadCursor = ""; tbody.replaceChildren(); }
  const mine = ++deadRequest;
  moreButton.disabled = true;
  try {
    const page = await api("/api/dead-letters?queue=" + encodeURIComponent(selected) + "&limit=" + DEAD_PAGE +
                           (deadCursor ? "&cursor=" + encodeURIComponent(deadCursor) : ""));
    if (mine !== deadRequest) return;  // another queue opened, or the list reloaded, meanwhile
    tbody.append(...page.items.map(deadRow));
    deadCursor = page.next;
    moreButton.hidden = !page.next || page.items.length < DEAD_PAGE;
    status.textContent = (tbody.children.length ? tbody.children.length + " shown" : "no dead letters") +
      (page.skipped.length ? " · not shown: those on " + page.skipped.join(", ") + " (down)" : "");
  } catch (e) {
    if (mine === deadRequest) status.textContent = "could not read the dead letters: " + e.message;
  } finally {
    moreButton.disabled = false;
  }
  updateRequeueButton();
}

function selectedIds() {
  return [...document.querySelectorAll("#dead tbody input:checked")].map(b => b.value);
}

function updateRequeueButton() {
  document.getElementById("requeue-selected").disabled = selectedIds().length === 0;
}

async function requeue(ids) {
  const what = ids === "all" ? "every dead letter of " + selected : ids.length + " dead letter(s) of " + selected;
  if (!window.confirm("Requeue " + what + "? They go back to ready with fresh attempts.")) return;
  const status = document.getElementById("dead-status");
  try {
    const r = await api("/api/requeue", {method: "POST", headers: {"Content-Type": "application/json", "X-Conveyor": "1"},
                                          body: JSON.stringify({queue: selected, ids: ids})});
    await loadDead(false);
    status.textContent = "requeued " + r.requeued + (r.skipped.length ? " (not those on " + r.skipped.join(", ") +
      ": down)" : "") + "; " + status.textContent;
  } catch (e) {
    status.textContent = "requeue failed: " + e.message;
  }
}

function openQueue(name, linked = true) {
  if (linked) window.history.replaceState(null, "", taskHash(name, null));
  showTask(null);  // a task page opens after, when the URL names one
  selected = name;
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-name").textContent = name;
  for (const tr of document.querySelectorAll("#queues tbody tr")) tr.classList.toggle("selected", tr.dataset.queue === name);
  if (lastOverview) drawDetail(lastOverview);
  refreshHistory().catch(() => {});  // its charts now, not at the next refresh (which says if this failed)
  loadDead(false);
  loadTasks();
}

function setShowInternal(on) {
  showInternal = on;
  for (const scope of document.querySelectorAll("#charts .scope")) scope.textContent = on ? "all queues" : "the user's queues";
}

document.addEventListener("DOMContentLoaded", () => {
  const toggle = document.getElementById("show-internal");
  toggle.checked = showInternal;
  setShowInternal(showInternal);
  toggle.addEventListener("change", () => {
    setShowInternal(toggle.checked);
    const url = new URL(window.location.href);
    if (toggle.checked) url.searchParams.set("internal", "1"); else url.searchParams.delete("internal");
    window.history.replaceState(null, "", url);
    if (lastOverview) drawQueues(lastOverview.queues, lastOverview.servers);
    refreshHistory().catch(() => {});  // the next refresh says so if the dashboard is unreachable
  });
  for (const svg of document.querySelectorAll("svg.chart")) watchPointer(svg.id);
  document.getElementById("detail-close").addEventListener("click", () => {
    selected = null;
    showTask(null);
    document.getElementById("detail").hidden = true;
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  });
  document.getElementById("task-close").addEventListener("click", () => {
    showTask(null);
    window.history.replaceState(null, "", taskHash(selected, null));
  });
  document.getElementById("task-cancel").addEventListener("click", cancelTask);
  for (const id of ["tasks-search", "tasks-state", "tasks-id"]) {
    document.getElementById(id).addEventListener(id === "tasks-state" ? "change" : "input", () => loadTasks());
  }
  window.addEventListener("hashchange", route);
  route();
  document.getElementById("dead-more").addEventListener("click", () => loadDead(true));
  document.getElementById("requeue-selected").addEventListener("click", () => requeue(selectedIds()));
  document.getElementById("requeue-all").addEventListener("click", () => requeue("all"));
  document.getElementById("dead-all").addEventListener("change", e => {
    for (const b of document.querySelectorAll("#dead tbody input")) b.checked = e.target.checked;
    updateRequeueButton();
  });
  refresh();
});

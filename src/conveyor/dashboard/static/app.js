// The Conveyor dashboard: polls the JSON endpoints every second and redraws. Everything from the
// servers goes in as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const DEAD_PAGE = 50;
let selected = null;          // the queue whose detail is open
let deadCursor = "";          // where the next page of its dead letters starts
let lastOverview = null;
let deadRequest = 0;          // the latest request for dead letters: an answer to an older one is dropped

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

function drawQueues(queues) {
  document.getElementById("queue-count").textContent = "(" + queues.length + ")";
  fill(document.querySelector("#queues tbody"), queues.map(q => {
    const tr = row([q.name, ...queueCells(q)], q.name === selected ? "selected" : "");
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
    const cells = per ? queueCells(per) : Array(8).fill(s.up ? "–" : "down");
    return row([String(s.shard), s.address, ...cells], s.up ? "" : "gone");
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
    return row([j.queue, cell, num(j.rows_done), num(j.rows_total), num(j.done), num(j.total), num(j.failed),
                rate(inRows ? j.rows_rate : null), duration(j.eta_s)]);
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

// A line chart of one or more series over time, scaled to the largest value.
function chart(svgId, times, series) {
  const svg = document.getElementById(svgId);
  const W = 600, H = 140, pad = 14;
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  const max = Math.max(1, ...series.flatMap(s => s.values));
  const t0 = times.length ? times[0] : 0, t1 = times.length ? times[times.length - 1] : 1;
  const x = t => pad + (W - 2 * pad) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = v => H - pad - (H - 2 * pad) * v / max;
  for (const s of series) {
    if (!s.values.length) continue;
    const p = document.createElementNS(ns, "path");
    p.setAttribute("d", s.values.map((v, i) => (i ? "L" : "M") + x(times[i]).toFixed(1) + "," + y(v).toFixed(1)).join(""));
    p.setAttribute("class", s.cls);
    parts.push(p);
  }
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", "2");
  label.setAttribute("y", "10");
  label.textContent = "max " + rate(max) + (times.length ? ", last " + duration(t1 - t0) : "");
  parts.push(label);
  svg.replaceChildren(...parts);
}

async function refreshHistory() {
  const all = await api("/api/history");
  chart("chart-rates", all.time, [{values: all.put_rate, cls: "put"}, {values: all.ack_rate, cls: "ack"}]);
  chart("chart-ready", all.time, [{values: all.ready, cls: "ready"}]);
  if (selected !== null) {
    const one = await api("/api/history?queue=" + encodeURIComponent(selected));
    chart("chart-q-rates", one.time, [{values: one.put_rate, cls: "put"}, {values: one.ack_rate, cls: "ack"}]);
    chart("chart-q-ready", one.time, [{values: one.ready, cls: "ready"}]);
  }
}

async function refresh() {
  try {
    const o = await api("/api/overview");
    lastOverview = o;
    drawServers(o.servers);
    drawQueues(o.queues);
    drawDetail(o);
    drawJobs(o.jobs);
    drawConsumers(o.consumers);
    await refreshHistory();
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

function deadRow(d) {
  const box = el("input");
  box.type = "checkbox";
  box.value = d.id;
  box.addEventListener("change", updateRequeueButton);
  const pick = el("td");
  pick.append(box);
  const error = el("td", null, "text");
  const lines = d.error.split("\n").filter(line => line.trim());
  if (lines.length > 1) {
    const det = el("details");
    det.append(el("summary", lines[lines.length - 1]), el("pre", d.error));
    error.append(det);
  } else {
    error.textContent = d.error;
  }
  const tr = row([pick, d.id, String(d.shard), String(d.attempts), new Date(d.failed_at * 1000).toLocaleString(),
                  d.task, error, el("td", d.payload, "text")]);
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

function openQueue(name) {
  selected = name;
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-name").textContent = name;
  for (const tr of document.querySelectorAll("#queues tbody tr")) tr.classList.toggle("selected", tr.dataset.queue === name);
  if (lastOverview) drawDetail(lastOverview);
  loadDead(false);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("detail-close").addEventListener("click", () => {
    selected = null;
    document.getElementById("detail").hidden = true;
  });
  document.getElementById("dead-more").addEventListener("click", () => loadDead(true));
  document.getElementById("requeue-selected").addEventListener("click", () => requeue(selectedIds()));
  document.getElementById("requeue-all").addEventListener("click", () => requeue("all"));
  document.getElementById("dead-all").addEventListener("change", e => {
    for (const b of document.querySelectorAll("#dead tbody input")) b.checked = e.target.checked;
    updateRequeueButton();
  });
  refresh();
});

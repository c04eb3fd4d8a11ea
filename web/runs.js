// Runs page: the table of runs, polled every 2 s and updated in place so
// keyboard focus and scroll position survive each refresh; a filter by status and name,
// and the runs ticked for comparison, both kept in the URL.

import { getJSON, paths } from "./api.js";
import { showIdentity } from "./who.js";
import { Comparison } from "./compare.js";
import { MAX_COMPARED, choiceQuery, matches, parseChoice } from "./compare_figure.js";
import {
  badge,
  displayName,
  el,
  formatAgo,
  formatCount,
  formatDuration,
  formatRate,
  formatScale,
  formatTime,
  setText,
  showAlert,
} from "./dom.js";

const POLL_MS = 2000;
const table = document.getElementById("runs");
const tbody = table.querySelector("tbody");
const rows = new Map();
const known = new Map(); // run id -> the run as last listed
const choice = parseChoice(window.location.search);
const statusFilter = document.getElementById("status-filter");
const nameFilter = document.getElementById("name-filter");
const comparison = new Comparison(document.getElementById("compare"), {
  onRemove: (id) => choose(id, false),
  onClear: () => {
    choice.runs = [];
    changed();
  },
});

const COLUMNS = [
  { key: "name", label: "Name", cls: "name" },
  { key: "status", label: "Status" },
  { key: "world_size", label: "World size", cls: "num", show: formatCount },
  { key: "steps", label: "Steps", cls: "num", show: formatCount },
  { key: "scale", label: "Current scale", cls: "num", show: (value) => formatScale(value, { under: "" }) },
  { key: "overflows", label: "Overflows", cls: "num", show: formatCount },
  { key: "skipped_rate", label: "Skipped steps", cls: "num", show: formatRate },
  // A count under a ⚠ heading, the rules named on hover and to screen readers: the table
  // still fits 1280 pixels.
  { key: "alerts", label: "Alerts", cls: "num alerts", show: (rules) => (rules.length ? String(rules.length) : "–") },
  { key: "started_at", label: "Started", cls: "time", show: formatTime },
  { key: "ended_at", label: "Ended", cls: "time", show: formatTime },
  { key: "duration", label: "Duration", cls: "num", show: formatDuration },
  { key: "last_heartbeat", label: "Last seen", cls: "time", show: (t) => formatAgo(t) },
];

// A running run's duration so far; an ended one's from its start to its end.
function duration(run, now = Date.now() / 1000) {
  if (run.started_at === null || run.started_at === undefined) return null;
  return (run.ended_at ?? (run.status === "running" ? now : run.last_heartbeat)) - run.started_at;
}

// Run id -> the names of the rules firing on it, sorted.
function firingRules(alerts) {
  const byRun = new Map();
  for (const alert of alerts) {
    byRun.set(alert.run.id, [...(byRun.get(alert.run.id) || []), alert.rule].sort());
  }
  return byRun;
}

function makeRow(run) {
  const cells = {};
  const tr = el("tr", { dataset: { runId: run.id } });
  for (const column of COLUMNS) {
    const td = el("td", { class: column.cls, "data-label": column.label });
    cells[column.key] = td;
    tr.append(td);
  }
  const link = el("a", { href: `run.html?run=${encodeURIComponent(run.id)}` });
  const pick = el("input", {
    type: "checkbox",
    class: "pick",
    onchange: (event) => choose(run.id, event.target.checked),
  });
  cells.name.append(pick, link);
  return { tr, cells, link, pick, status: null };
}

function updateRow(row, run) {
  const name = displayName(run.name);
  setText(row.link, name);
  row.link.setAttribute("aria-label", `Open run ${name}`);
  row.pick.setAttribute("aria-label", `Compare ${name}`);
  row.pick.checked = choice.runs.includes(run.id);
  row.tr.hidden = !matches(run, choice);
  run = { ...run, duration: duration(run) };
  if (row.status !== run.status) {
    row.cells.status.replaceChildren(badge(run.status));
    row.status = run.status;
    row.tr.dataset.status = run.status;
  }
  for (const column of COLUMNS) {
    if (column.show) setText(row.cells[column.key], column.show(run[column.key]));
  }
  row.cells.last_heartbeat.title = run.last_heartbeat ? formatTime(run.last_heartbeat) : "";
  const alerts = row.cells.alerts;
  alerts.classList.toggle("alert-firing", run.alerts.length > 0);
  alerts.dataset.firing = String(run.alerts.length);
  alerts.title = run.alerts.length ? `Firing: ${run.alerts.join(", ")}` : "";
  if (run.alerts.length) alerts.setAttribute("aria-label", `${run.alerts.length} firing: ${run.alerts.join(", ")}`);
  else alerts.removeAttribute("aria-label");
}

function render(runs) {
  const seen = new Set();
  known.clear();
  runs.forEach((run, index) => {
    known.set(run.id, run);
    let row = rows.get(run.id);
    if (!row) {
      row = makeRow(run);
      rows.set(run.id, row);
    }
    updateRow(row, run);
    if (tbody.children[index] !== row.tr) tbody.insertBefore(row.tr, tbody.children[index] || null);
    seen.add(run.id);
  });
  for (const [id, row] of rows) {
    if (!seen.has(id)) {
      row.tr.remove();
      rows.delete(id);
    }
  }
  table.dataset.count = String(runs.length);
  document.getElementById("empty").hidden = runs.length > 0;
  showFiltered();
}

function showFiltered() {
  let shown = 0;
  for (const [id, row] of rows) {
    row.tr.hidden = !matches(known.get(id), choice);
    if (!row.tr.hidden) shown += 1;
  }
  const filtered = Boolean(choice.status || choice.name.trim());
  setText(document.getElementById("shown"), filtered ? `${shown} of ${rows.size} runs shown` : "");
  document.getElementById("no-match").hidden = !(filtered && rows.size > 0 && shown === 0);
}

function choose(id, on) {
  const at = choice.runs.indexOf(id);
  if (on && at < 0) {
    if (choice.runs.length >= MAX_COMPARED) {
      rows.get(id).pick.checked = false;
      comparison.refuse(`At most ${MAX_COMPARED} runs are compared at once: remove one first.`);
      return;
    }
    choice.runs.push(id);
  } else if (!on && at >= 0) {
    choice.runs.splice(at, 1);
  }
  changed();
}

// The choice changed: the URL, the ticks, the filter and the comparison follow it.
function changed() {
  window.history.replaceState(null, "", choiceQuery(choice) || window.location.pathname);
  for (const [id, row] of rows) row.pick.checked = choice.runs.includes(id);
  showFiltered();
  comparison.show(choice.runs, known, { changed: true });
}

statusFilter.value = choice.status;
nameFilter.value = choice.name;
statusFilter.addEventListener("change", () => {
  choice.status = statusFilter.value;
  changed();
});
nameFilter.addEventListener("input", () => {
  choice.name = nameFilter.value;
  changed();
});
document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());

async function refresh() {
  try {
    const [body, firing] = await Promise.all([
      getJSON(paths.runs()),
      getJSON(paths.alerts({ state: "firing", limit: 10000 })),
    ]);
    const rules = firingRules(firing.alerts || []);
    const runs = [...(body.runs || [])].map((run) => ({ ...run, alerts: rules.get(run.id) || [] })).sort(
      (a, b) => (b.started_at ?? 0) - (a.started_at ?? 0) || b.id - a.id,
    );
    render(runs);
    comparison.show(choice.runs, known);
    showAlert(document.getElementById("error"), "");
    setText(
      document.getElementById("updated"),
      `Updated ${formatTime(Date.now())} · refreshes every ${POLL_MS / 1000} s`,
    );
  } catch (error) {
    showAlert(document.getElementById("error"), `Could not load runs: ${error.message}`);
  } finally {
    setTimeout(refresh, POLL_MS);
  }
}

showIdentity().then((who) => {
  if (who !== null) refresh(); // else the sign-in box asks for a token first
}, (error) => showAlert(document.getElementById("error"), `Could not reach the service: ${error.message}`));

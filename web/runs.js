// Runs page: the table of runs, polled every 2 s and updated in place so
// keyboard focus and scroll position survive each refresh.

import { getJSON, paths } from "./api.js";
import {
  badge,
  el,
  formatAgo,
  formatCount,
  formatRate,
  formatScale,
  setText,
  showAlert,
} from "./dom.js";

const POLL_MS = 2000;
const table = document.getElementById("runs");
const tbody = table.querySelector("tbody");
const rows = new Map();

const COLUMNS = [
  { key: "name", label: "Name", cls: "name" },
  { key: "status", label: "Status" },
  { key: "world_size", label: "World size", cls: "num", show: formatCount },
  { key: "steps", label: "Steps", cls: "num", show: formatCount },
  { key: "scale", label: "Current scale", cls: "num", show: formatScale },
  { key: "overflows", label: "Overflows", cls: "num", show: formatCount },
  { key: "skipped_rate", label: "Skipped steps", cls: "num", show: formatRate },
  { key: "last_heartbeat", label: "Last seen", show: (t) => formatAgo(t) },
];

function makeRow(run) {
  const cells = {};
  const tr = el("tr", { dataset: { runId: run.id } });
  for (const column of COLUMNS) {
    const td = el("td", { class: column.cls, "data-label": column.label });
    cells[column.key] = td;
    tr.append(td);
  }
  const link = el("a", { href: `run.html?run=${encodeURIComponent(run.id)}` });
  cells.name.append(link);
  return { tr, cells, link, status: null };
}

function updateRow(row, run) {
  setText(row.link, run.name);
  row.link.setAttribute("aria-label", `Open run ${run.name}`);
  if (row.status !== run.status) {
    row.cells.status.replaceChildren(badge(run.status));
    row.status = run.status;
    row.tr.dataset.status = run.status;
  }
  for (const column of COLUMNS) {
    if (column.show) setText(row.cells[column.key], column.show(run[column.key]));
  }
  row.cells.last_heartbeat.title = run.last_heartbeat
    ? new Date(run.last_heartbeat * 1000).toString()
    : "";
}

function render(runs) {
  const seen = new Set();
  runs.forEach((run, index) => {
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
}

async function refresh() {
  try {
    const body = await getJSON(paths.runs());
    const runs = [...(body.runs || [])].sort(
      (a, b) => (b.started_at ?? 0) - (a.started_at ?? 0) || b.id - a.id,
    );
    render(runs);
    showAlert(document.getElementById("error"), "");
    setText(
      document.getElementById("updated"),
      `Updated ${new Date().toLocaleTimeString()} · refreshes every ${POLL_MS / 1000} s`,
    );
  } catch (error) {
    showAlert(document.getElementById("error"), `Could not load runs: ${error.message}`);
  } finally {
    setTimeout(refresh, POLL_MS);
  }
}

refresh();

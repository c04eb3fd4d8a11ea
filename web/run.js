// Run page: facts, charts (live over server-sent events), control, export.

import { AlertsView } from "./alerts.js";
import { ApiError, getJSON, paths, storedToken, withTicket } from "./api.js";
import { RunChart } from "./chart.js";
import { AutopilotPanel } from "./autopilot.js";
import { ControlPanel } from "./control.js";
import { OverflowDetail, ParamsPanel } from "./diagnosis.js";
import { LiveFacts, forecastText, scheduleText, spikesText } from "./facts.js";
import { ScaleLoadsView } from "./scale_loads.js";
import { controlFields } from "./rules.js";
import { canWrite, refreshIdentity, showIdentity } from "./who.js";
import {
  badge,
  displayName,
  el,
  formatAgo,
  formatCount,
  formatRate,
  formatScale,
  formatSignificant,
  UNDER_ONE_SHORT,
  formatTime,
  setText,
  showAlert,
} from "./dom.js";

const DETAIL_POLL_MS = 2000;
// The last step's gradient norm; "–" where it is not measured or was not finite.
const formatGradNorm = (value) => (value === null || value === undefined ? "–" : formatSignificant(value));
const PARAMS_REFRESH_MS = 5000; // at most this often for live overflows (a ranking reads every finding of its window)
const RECONNECT_MS = 5000;

const runId = new URLSearchParams(window.location.search).get("run");
const errorBox = document.getElementById("error");
const live = document.getElementById("live");
let currentStatus = null;
let stream = null;
let runMissing = false;
const facts = new LiveFacts(); // the cards' figures, at the latest step the chart has too

function reportError(error) {
  if (runMissing || (error instanceof ApiError && error.status === 404)) {
    showAlert(errorBox, `There is no run ${runId} in this store. Open one from the list of runs.`);
    return;
  }
  showAlert(errorBox, error && error.message ? error.message : String(error));
}

// A last event's JSON body ({} without one: the event still ends the stream).
function eventBody(event) {
  try {
    return JSON.parse(event.data) || {};
  } catch {
    return {};
  }
}

function setLive(state, text) {
  live.dataset.state = state;
  setText(live, text);
}

function renderDetail(run, panel) {
  const name = displayName(run.name);
  setText(document.getElementById("run-name"), name);
  document.title = `${name} · scalewatch`;
  if (currentStatus !== run.status) {
    document.getElementById("run-status").replaceChildren(badge(run.status));
    panel.setRunStatus(run.status);
    currentStatus = run.status;
  }
  const facts = {
    world_size: formatCount(run.world_size),
    steps: formatCount(run.steps),
    scale: formatScale(run.scale, { under: UNDER_ONE_SHORT }),
    overflows: formatCount(run.overflows),
    skipped_rate: formatRate(run.skipped_rate),
    spikes: spikesText(run.spikes),
    grad_norm: formatGradNorm(run.grad_norm),
    last_heartbeat: formatAgo(run.last_heartbeat),
    started_at: formatTime(run.started_at),
    dropped: formatCount(run.dropped),
    host: [run.host, run.pid].filter((v) => v !== null && v !== undefined).join(" · ") || "–",
    torch_version: run.torch_version || "–",
  };
  for (const [key, text] of Object.entries(facts)) {
    setText(document.querySelector(`[data-fact="${key}"]`), text);
  }
  const schedule = scheduleText(run);
  document.getElementById("schedule-fact").hidden = schedule === null;
  if (schedule !== null) setText(document.querySelector('[data-fact="schedule"]'), schedule);
  const heading = forecastText(run);
  document.getElementById("forecast-fact").hidden = heading === null;
  if (heading !== null) setText(document.querySelector('[data-fact="forecast"]'), heading);
}

async function pollDetail(panel, loads) {
  try {
    const run = await getJSON(paths.run(runId));
    facts.setDetail(run);
    renderDetail(facts.current(), panel);
    loads.onDetail(run);
    if (errorBox.dataset.source === "detail") showAlert(errorBox, "");
  } catch (error) {
    errorBox.dataset.source = "detail";
    if (error instanceof ApiError && error.status === 404) {
      runMissing = true;
      reportError(error);
      if (stream) stream.close();
      setLive("ended", "not live: no such run");
      return;
    }
    reportError(new Error(`Could not load the run: ${error.message}`));
  }
  setTimeout(() => pollDetail(panel, loads), DETAIL_POLL_MS);
}

function throttle(fn, ms) {
  let timer = null;
  return () => {
    if (timer === null) {
      timer = setTimeout(() => {
        timer = null;
        fn();
      }, ms);
    }
  };
}

function renderExports() {
  const box = document.getElementById("export-links");
  for (const what of ["overflows", "steps"]) {
    for (const format of ["csv", "jsonl"]) {
      box.append(
        el("a", {
          class: "button secondary",
          href: paths.exportFile(runId, what, format),
          download: `run-${runId}-${what}.${format}`,
          dataset: { export: `${what}-${format}` },
          text: `${what[0].toUpperCase()}${what.slice(1)} · ${format.toUpperCase()}`,
        }),
      );
      box.lastChild.addEventListener("click", (event) => {
        if (!storedToken() || event.currentTarget.dataset.ticketed) return;
        event.preventDefault();
        const link = event.currentTarget;
        withTicket(paths.exportFile(runId, what, format)).then((href) => {
          link.href = href;
          link.dataset.ticketed = "1";
          link.click();
          delete link.dataset.ticketed;
        }, reportError);
      });
    }
  }
}

// EventSource resumes by itself with Last-Event-ID after a dropped connection;
// a stream the server refused outright is reopened here after a pause.
async function openStream(chart, panel, after) {
  // A new ticket each time: one is good for a minute, and the EventSource's own
  // reconnection with a stale one is refused, which lands here again.
  stream = new EventSource(await withTicket(paths.stream(runId, after)));
  stream.addEventListener("open", () => setLive("live", "live"));
  stream.addEventListener("step", (event) => {
    const step = JSON.parse(event.data);
    chart.addLiveStep(step);
    panel.onStep(step);
    facts.addStep(step);
    if (facts.current()) renderDetail(facts.current(), panel);
  });
  stream.addEventListener("control", (event) => panel.onEvent(JSON.parse(event.data)));
  // The service was too busy to send every step live: it skipped to the newest.
  stream.addEventListener("coalesced", (event) => {
    chart.addCoalesced(JSON.parse(event.data));
    live.dataset.coalesced = String(chart.coalesced);
    setLive("live", `live · busy: ${chart.coalesced} steps drawn from the store, not live`);
  });
  stream.addEventListener("end", (event) => {
    stream.close();
    const status = eventBody(event).status || "";
    setLive("ended", status ? `not live: run ${status}` : "not live: run ended");
  });
  // The identity that opened the stream was revoked or has expired: no reconnecting.
  stream.addEventListener("refused", (event) => {
    stream.close();
    const detail = eventBody(event).detail || "";
    setLive("ended", `not live: ${detail || "access refused"}; reload with a valid token`);
  });
  stream.addEventListener("error", () => {
    if (stream.readyState === EventSource.CLOSED) {
      if (live.dataset.state === "ended" || runMissing) return;
      setLive("offline", "disconnected; retrying");
      setTimeout(
        () => openStream(chart, panel, chart.lastStep >= 0 ? chart.lastStep : undefined).catch(reportError),
        RECONNECT_MS,
      );
    } else {
      setLive("reconnecting", "reconnecting");
    }
  });
}

async function main() {
  if (!runId || !/^[1-9][0-9]*$/.test(runId)) {
    setText(document.getElementById("run-name"), runId ? "Not a run" : "No run selected");
    showAlert(
      errorBox,
      runId ? `"${runId}" is not a run id. Open a run from the list of runs.` : "Open a run from the list of runs.",
    );
    for (const section of document.querySelectorAll("main section, #facts")) section.hidden = true;
    setLive("ended", "");
    return;
  }
  if (!window.Plotly) {
    showAlert(errorBox, "The charting library (vendor/plotly.min.js) did not load.");
    return;
  }
  const who = await showIdentity();
  if (who === null) return; // the sign-in box asks for a token
  renderExports();
  const chartNode = document.getElementById("chart");
  const info = document.getElementById("chart-info");
  const detail = new OverflowDetail(runId, document.getElementById("overflow-detail"));
  const ranked = new ParamsPanel(runId, document.getElementById("params-panel"));
  const chart = new RunChart(chartNode, runId, {
    onError: reportError,
    onInfo: ({ bucketWidth, view, busy, coarse }) => {
      const range = view ? `steps ${view[0]}–${view[1]}` : "whole run";
      const buckets = bucketWidth === 1 ? "every step" : `buckets of ${bucketWidth} steps`;
      info.dataset.busy = coarse ? "1" : "";
      setText(info, `${range} · ${buckets}${coarse ? " · busy, showing coarser data" : ""}`);
      if (!busy) ranked.refresh(view).catch(reportError);
    },
    onOverflow: (step) => detail.show(step),
    onLiveOverflow: throttle(() => ranked.refresh().catch(reportError), PARAMS_REFRESH_MS),
  });
  let autopilot = null;
  const panel = new ControlPanel(runId, controlFields(await getJSON(paths.controlRules())), {
    onMarkers: (markers) => chart.setMarkers(markers),
    onError: reportError,
    onStatus: (status) => autopilot && autopilot.setRunStatus(status),
    // A change (the autopilot's, say) can come with a new decision.
    onChange: () => autopilot && autopilot.refresh().catch(reportError),
    onToken: () => refreshIdentity().catch(reportError),
  });
  autopilot = new AutopilotPanel(runId, panel, { onError: reportError });
  if (!canWrite(who)) {
    panel.setReadOnly(`Signed in as ${who.name}, a ${who.role}: only an operator or an admin changes runs.`);
    autopilot.setReadOnly();
  }
  const loads = new ScaleLoadsView(runId, { onMarks: (marks) => chart.setLoadMarks(marks), onError: reportError });
  loads.refresh();
  pollDetail(panel, loads);
  new AlertsView(runId, { onMarks: (marks) => chart.setAlertMarkers(marks), onError: reportError }).poll();
  try {
    await Promise.all([chart.start(), panel.refresh(), autopilot.refresh()]);
  } finally {
    // From the last step the chart drew: a stream opened before would start after the
    // last step when the server took it, and miss the steps written in between.
    openStream(chart, panel, chart.lastStep >= 0 ? chart.lastStep : -1).catch(reportError);
  }
}

main().catch(reportError);

// Compare runs: the runs page's filter and choice (kept in the URL), and the overlaid
// chart's traces, from each run's chart buckets (min/max per bucket, so no overflow or
// skipped step is sampled away). No DOM, no fetching here; see compare.js.

import { RollingRate, extent, powerTicks } from "./chart_figure.js";

export const STATUSES = ["running", "finished", "crashed"];
export const MAX_COMPARED = 8;
export const COMPARE_POINTS = 1000;
// Steps in the rolling skipped-step rate, as on the run page; at least one bucket.
export const MIN_RATE_WINDOW = 200;
// Colour-blind-safe (Okabe–Ito), one per compared run.
export const PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#8a5300"];

// The page's state from its query string: ?status=running&name=bert&compare=3,7
export function parseChoice(search) {
  const query = new URLSearchParams(search);
  const status = STATUSES.includes(query.get("status")) ? query.get("status") : "";
  const runs = [];
  for (const part of (query.get("compare") || "").split(",")) {
    const id = Number(part);
    if (Number.isSafeInteger(id) && id >= 1 && !runs.includes(id) && runs.length < MAX_COMPARED) runs.push(id);
  }
  return { status, name: query.get("name") || "", runs };
}

// The query string of a state: empty parts left out, so a page with no choice is plain "".
export function choiceQuery({ status, name, runs }) {
  const query = new URLSearchParams();
  if (status) query.set("status", status);
  if (name) query.set("name", name);
  if (runs.length) query.set("compare", runs.join(","));
  const text = query.toString().replaceAll("%2C", ",");
  return text ? `?${text}` : "";
}

// Whether a run shows under the filter: its status, and its name containing the text
// (case-insensitive; blanks around the text ignored).
export function matches(run, { status, name }) {
  if (status && run.status !== status) return false;
  const text = name.trim().toLowerCase();
  return !text || String(run.name).toLowerCase().includes(text);
}

// Plotly reads trace names as its own small HTML: a run's name must show as text.
export function plotlyText(text) {
  return String(text).replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

// The skipped share of the last ``window`` steps at each bucket's end (whole buckets).
export function skipRates(series, window) {
  const rate = new RollingRate(window);
  return series.n.map((n, i) => rate.push(series.last_step[i], n, series.skipped[i]));
}

// One window for every compared run, so their rates read alike: the run page's, or the
// widest bucket of any of them.
export function rateWindow(charts) {
  return Math.max(MIN_RATE_WINDOW, ...[...charts.values()].map((c) => Number(c.bucketWidth) || 1));
}

// The traces of one run: its scale band (min to max of each bucket), the scale at each
// bucket's end, and its skipped-step rate below; one legend entry toggles all three.
export function runTraces(run, series, colour, window) {
  const group = `run-${run.id}`;
  const name = plotlyText(`${run.name} (#${run.id})`);
  const band = { type: "scatter", mode: "lines", x: series.first_step, legendgroup: group, hoverinfo: "skip",
    showlegend: false, line: { width: 0, color: colour, shape: "hv" } };
  return [
    { ...band, name: `${name} max`, y: series.scale_max },
    { ...band, name: `${name} min–max`, y: series.scale_min, fill: "tonexty", fillcolor: `${colour}33` },
    {
      type: "scatter",
      mode: "lines",
      name,
      x: series.last_step,
      y: series.scale_last,
      legendgroup: group,
      line: { color: colour, width: 1.6, shape: "hv" },
      hovertemplate: `${name}<br>step %{x}: scale %{y}<extra></extra>`,
    },
    {
      type: "scatter",
      mode: "lines",
      name: `${name} skipped`,
      x: series.last_step,
      y: skipRates(series, window),
      yaxis: "y2",
      legendgroup: group,
      showlegend: false,
      line: { color: colour, width: 1.2 },
      hovertemplate: `${name}<br>step %{x}: skipped %{y:.2%} of the last ${window} steps<extra></extra>`,
    },
  ];
}

// Every compared run's traces, in the order chosen; ``charts`` holds each run's chart
// answer (``{series, bucketWidth}``) by run id, a run without one (not loaded) left out.
export function overlayTraces(runs, charts, window = rateWindow(charts)) {
  return runs.flatMap((run, i) =>
    charts.has(run.id) ? runTraces(run, charts.get(run.id).series, PALETTE[i % PALETTE.length], window) : [],
  );
}

// The scale axis's ticks at powers of two, as the run page's: over every compared run's
// scales (Plotly's own log ticks read "7 6 5 4 3 2 10k 9 8").
export function scaleTicks(charts) {
  const scales = [...charts.values()].flatMap(({ series }) => [...series.scale_min, ...series.scale_max]);
  const ticks = powerTicks(extent(scales));
  return "yaxis.tickmode" in ticks
    ? { tickmode: ticks["yaxis.tickmode"], tickvals: ticks["yaxis.tickvals"], ticktext: ticks["yaxis.ticktext"] }
    : {};
}

export function overlayLayout(narrow, window, charts = new Map()) {
  return {
    autosize: true,
    margin: { l: narrow ? 52 : 70, r: 12, t: 36, b: 44 },
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12 },
    hovermode: "closest",
    showlegend: true,
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    xaxis: { title: { text: "step" }, anchor: "y2" },
    yaxis: { type: "log", title: { text: "loss scale" }, domain: [0.3, 1], anchor: "x", ...scaleTicks(charts) },
    yaxis2: { title: { text: narrow ? "skipped" : `skipped (last ${window})` }, domain: [0, 0.24], rangemode: "tozero", tickformat: ".1~%", anchor: "x" },
  };
}

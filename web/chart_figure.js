// What the run's charts look like: traces, layout, axis ticks, and the
// per-bucket values they are built from. No data flow here; see chart.js.

export const T = {
  scaleMax: 0,
  scaleMin: 1,
  scaleLast: 2,
  overflows: 3,
  trackerMax: 4,
  trackerMin: 5,
  trackerLast: 6,
  skipRate: 7,
};
export const LINE_TRACES = [
  T.scaleMax,
  T.scaleMin,
  T.scaleLast,
  T.trackerMax,
  T.trackerMin,
  T.trackerLast,
  T.skipRate,
];
export const AUTORANGE_Y = { "yaxis.autorange": true, "yaxis2.autorange": true, "yaxis3.autorange": true };
// Skipped steps over the last `window` steps, fed bucket by bucket.
export class RollingRate {
  constructor(window) {
    this.window = window;
    this.entries = [];
    this.head = 0;
    this.n = 0;
    this.skipped = 0;
  }

  push(lastStep, n, skipped) {
    this.entries.push([lastStep, n, skipped]);
    this.n += n;
    this.skipped += skipped;
    while (this.head < this.entries.length - 1 && this.entries[this.head][0] <= lastStep - this.window) {
      const [, oldN, oldSkipped] = this.entries[this.head];
      this.n -= oldN;
      this.skipped -= oldSkipped;
      this.head += 1;
    }
    if (this.head > 4096) {
      this.entries = this.entries.slice(this.head);
      this.head = 0;
    }
    return this.n > 0 ? this.skipped / this.n : 0;
  }
}

// Loss scales are powers of two in practice: tick the log axis at 2^k.
export function powerTicks([lo, hi]) {
  if (!(lo > 0) || !(hi > 0)) return {};
  let a = Math.floor(Math.log2(lo));
  let b = Math.ceil(Math.log2(hi));
  if (a === b) {
    a -= 1;
    b += 1;
  }
  const every = Math.max(1, Math.ceil((b - a) / 8));
  const tickvals = [];
  const ticktext = [];
  for (let k = Math.ceil(a / every) * every; k <= b; k += every) {
    tickvals.push(2 ** k);
    ticktext.push(`2<sup>${k}</sup>`);
  }
  return { "yaxis.tickmode": "array", "yaxis.tickvals": tickvals, "yaxis.ticktext": ticktext };
}

export function extent(values, start = [Infinity, -Infinity]) {
  let [lo, hi] = start;
  for (const v of values) {
    if (v > 0 && v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

export function emptyColumns() {
  return { x: [], scaleMin: [], scaleMax: [], scaleLast: [], trMin: [], trMax: [], trLast: [], rate: [], cdScale: [], cdTracker: [] };
}

// One live step row, as its own one-step bucket.
export function stepAsBucket(row) {
  const used = Number(row.scale);
  const after = Number(row.scale_after);
  return {
    first_step: row.step,
    last_step: row.step,
    n: 1,
    scale_min: Math.min(used, after),
    scale_max: Math.max(used, after),
    scale_last: after,
    tracker_min: row.growth_tracker,
    tracker_max: row.growth_tracker,
    tracker_last: row.growth_tracker,
    skipped: row.skipped ? 1 : 0,
  };
}

export function overflowPoint(item) {
  const ranks = (item.inf_ranks || []).join(", ") || "none recorded";
  return { x: item.step, y: item.scale, cd: [item.scale_after, ranks] };
}

export function figureTraces(cols, overflows) {
  const band = (y, yaxis, name, fill) => ({
    type: "scatter",
    mode: "lines",
    x: cols.x.slice(),
    y,
    yaxis,
    name,
    line: { width: 0, color: "rgba(11,87,208,0.25)" },
    fill: fill ? "tonexty" : "none",
    fillcolor: "rgba(11,87,208,0.18)",
    hoverinfo: "skip",
    showlegend: false,
    customdata: [],
  });
  return [
    band(cols.scaleMax, "y", "scale max", false),
    { ...band(cols.scaleMin, "y", "scale min–max", true), showlegend: true },
    {
      type: "scatter",
      mode: "lines",
      name: "scale (last)",
      x: cols.x.slice(),
      y: cols.scaleLast,
      customdata: cols.cdScale,
      line: { color: "#0b57d0", width: 1.6 },
      hovertemplate:
        "steps %{customdata[0]}–%{x}<br>last %{y:.6g}<br>" +
        "min %{customdata[1]:.6g} · max %{customdata[2]:.6g}<extra>scale</extra>",
    },
    {
      type: "scatter",
      mode: "markers",
      name: "overflow",
      x: overflows.map((p) => p.x),
      y: overflows.map((p) => p.y),
      customdata: overflows.map((p) => p.cd),
      marker: { symbol: "x-thin-open", size: 9, color: "#b42318", line: { width: 2, color: "#b42318" } },
      hovertemplate:
        "overflow at step %{x}<br>scale %{y:.6g} → %{customdata[0]:.6g}" +
        "<br>ranks with inf/NaN: %{customdata[1]}<extra></extra>",
    },
    {
      ...band(cols.trMax, "y2", "tracker max", false),
      line: { width: 0, color: "rgba(26,127,55,0.25)" },
    },
    {
      ...band(cols.trMin, "y2", "tracker min", true),
      line: { width: 0, color: "rgba(26,127,55,0.25)" },
      fillcolor: "rgba(26,127,55,0.18)",
    },
    {
      type: "scatter",
      mode: "lines",
      name: "growth tracker",
      x: cols.x.slice(),
      y: cols.trLast,
      yaxis: "y2",
      customdata: cols.cdTracker,
      line: { color: "#1a7f37", width: 1.4, shape: "hv" },
      hovertemplate: "steps %{customdata[0]}–%{x}<br>tracker %{y}<extra></extra>",
    },
    {
      type: "scatter",
      mode: "lines",
      name: "skipped-step rate",
      x: cols.x.slice(),
      y: cols.rate,
      yaxis: "y3",
      customdata: [],
      line: { color: "#8a5300", width: 1.4 },
      hovertemplate: "step %{x}<br>skipped %{y:.2%}<extra></extra>",
    },
  ];
}

export function figureLayout(narrow) {
  return {
    uirevision: "keep",
    autosize: true,
    margin: { l: narrow ? 52 : 70, r: 12, t: narrow ? 20 : 36, b: 44 },
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12 },
    hovermode: "closest",
    showlegend: !narrow,
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", traceorder: "normal" },
    xaxis: { title: { text: "step" }, anchor: "y3", showspikes: true, spikemode: "across", spikethickness: 1 },
    yaxis: { type: "log", title: { text: "loss scale" }, domain: [0.44, 1], fixedrange: true, anchor: "x" },
    yaxis2: { title: { text: "tracker" }, domain: [0.23, 0.4], fixedrange: true, rangemode: "tozero", anchor: "x" },
    yaxis3: { title: { text: "skipped" }, domain: [0, 0.19], fixedrange: true, rangemode: "tozero", tickformat: ".1~%", anchor: "x" },
    shapes: [],
    annotations: [],
  };
}

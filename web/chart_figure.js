// What the run's charts look like: traces, layout, axis ticks, and the
// per-bucket values they are built from. No data flow here; see chart.js.
// Top to bottom, on one step axis: the loss scale (y), the loss (y4), the learning
// rate (y5), the growth tracker (y2) and the skipped-step rate (y3).

import { formatNumber, formatScale } from "./dom.js";

export const T = {
  scaleMax: 0,
  scaleMin: 1,
  scaleLast: 2,
  overflows: 3,
  trackerMax: 4,
  trackerMin: 5,
  trackerLast: 6,
  skipRate: 7,
  lossMax: 8,
  lossMin: 9,
  lossLast: 10,
  lrMax: 11,
  lrMin: 12,
  lrLast: 13,
};
export const LINE_TRACES = [
  T.scaleMax,
  T.scaleMin,
  T.scaleLast,
  T.trackerMax,
  T.trackerMin,
  T.trackerLast,
  T.skipRate,
  T.lossMax,
  T.lossMin,
  T.lossLast,
  T.lrMax,
  T.lrMin,
  T.lrLast,
];
export const AUTORANGE_Y = {
  "yaxis.autorange": true,
  "yaxis2.autorange": true,
  "yaxis3.autorange": true,
  "yaxis4.autorange": true,
  "yaxis5.autorange": true,
};
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

// x: each bucket's last step (tracker, rate); xFirst: its first step (the scale's
// min-max band); xNext: where the scale line changes, the step after a bucket, from
// which the scale after its last update is the one used. The line is a step function
// (Plotly's "hv"), so at an overflow it shows the scale used there, as the marker does,
// and the backoff at the next step.
export function emptyColumns() {
  return {
    x: [],
    xFirst: [],
    xNext: [],
    scaleMin: [],
    scaleMax: [],
    scaleLast: [],
    trMin: [],
    trMax: [],
    trLast: [],
    rate: [],
    lossMin: [],
    lossMax: [],
    lossLast: [],
    lrMin: [],
    lrMax: [],
    lrLast: [],
    cdScale: [],
    cdTracker: [],
  };
}

// The finite values' extent of some losses (nulls are buckets without one), or null.
export function lossExtent(values, start = null) {
  let [lo, hi] = start || [Infinity, -Infinity];
  for (const v of values) {
    if (v === null || v === undefined || !Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo <= hi ? [lo, hi] : null;
}

// The scale used at a bucket's first step, where a drawing starts: exact for one step
// (of its two scales, the one it did not end with) and for a live row.
export function firstScale(b) {
  if (b.scale_first !== undefined) return b.scale_first;
  if (b.n !== 1) return b.scale_last;
  return b.scale_last === b.scale_min ? b.scale_max : b.scale_min;
}

// The line's points of one bucket: where the drawing starts (``first``), then the step after it.
export function addScalePoints(cols, b, first) {
  const range = `steps ${b.first_step}–${b.last_step}: min ${formatScale(b.scale_min)} · max ${formatScale(b.scale_max)}`;
  if (first) {
    const used = firstScale(b);
    cols.xNext.push(b.first_step);
    cols.scaleLast.push(used);
    cols.cdScale.push([formatScale(used), range]);
  }
  cols.xNext.push(b.last_step + 1);
  cols.scaleLast.push(b.scale_last);
  cols.cdScale.push([formatScale(b.scale_last), range]);
}

// Of the markers inside ``[x0, x1]`` (steps), those whose label stands at least ``gap``
// pixels right of the last label kept, at ``width`` pixels for the range: many changes
// close together keep their lines, and one label for a crowd, until zoomed in.
export function thinLabels(markers, [x0, x1], width, gap = 36) {
  const perStep = width / Math.max(1e-9, x1 - x0);
  const kept = [];
  let last = -Infinity;
  const inside = markers.filter((m) => m.step >= x0 && m.step <= x1).sort((a, b) => a.step - b.step);
  for (const m of inside) {
    const px = (m.step - x0) * perStep;
    if (px - last >= gap) {
      kept.push(m);
      last = px;
    }
  }
  return kept;
}

// One live step row, as its own one-step bucket.
export function stepAsBucket(row) {
  const used = Number(row.scale);
  const after = Number(row.scale_after);
  return {
    first_step: row.step,
    last_step: row.step,
    n: 1,
    scale_first: used,
    scale_min: Math.min(used, after),
    scale_max: Math.max(used, after),
    scale_last: after,
    tracker_min: row.growth_tracker,
    tracker_max: row.growth_tracker,
    tracker_last: row.growth_tracker,
    skipped: row.skipped ? 1 : 0,
    loss_min: finiteOrNull(row.loss),
    loss_max: finiteOrNull(row.loss),
    loss_last: finiteOrNull(row.loss),
    lr_min: finiteOrNull(row.lr),
    lr_max: finiteOrNull(row.lr),
    lr_last: finiteOrNull(row.lr),
  };
}

function finiteOrNull(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

// What an overflow's loss says: forward (the loss itself was already inf/NaN) or backward.
export function lossFlag(item) {
  const ranks = item.loss_nonfinite_ranks || [];
  if (ranks.length) return `not finite on rank${ranks.length > 1 ? "s" : ""} ${ranks.join(", ")}`;
  return "finite";
}

export function overflowPoint(item) {
  const ranks = (item.inf_ranks || []).join(", ") || "none recorded";
  // The chart's pages and live rows come without the parameters: "–" until clicked.
  const params = item.params ? formatNumber(item.params.length + (item.params_omitted || 0)) : "–";
  return {
    x: item.step,
    y: item.scale,
    cd: [formatScale(item.scale_after), ranks, formatScale(item.scale), lossFlag(item), params],
  };
}

// A bucket's min–max band on ``yaxis``: an invisible max line, then the min line filled
// up to it ("tonexty", so the two stay next to each other, max first); hover skips both.
// ``rgb`` ("r,g,b") colours it; ``shape`` "hv" draws it step by step; with ``legend``
// the band has a legend entry, its min trace's ``minName``.
export function bandPair({ x, max, min, yaxis, name, minName = `${name} min–max`, rgb, shape, legend = false }) {
  const trace = (y, traceName, fill) => ({
    type: "scatter",
    mode: "lines",
    x: x.slice(),
    y,
    yaxis,
    name: traceName,
    line: { width: 0, color: `rgba(${rgb},0.25)`, ...(shape ? { shape } : {}) },
    fill: fill ? "tonexty" : "none",
    fillcolor: `rgba(${rgb},0.18)`,
    hoverinfo: "skip",
    showlegend: fill && legend,
    customdata: [],
  });
  return [trace(max, `${name} max`, false), trace(min, minName, true)];
}

const BLUE = "11,87,208";
const GREEN = "26,127,55";
const PURPLE = "110,64,201";
const TEAL = "10,124,134";

export function figureTraces(cols, overflows) {
  return [
    ...bandPair({
      x: cols.xFirst,
      max: cols.scaleMax,
      min: cols.scaleMin,
      yaxis: "y",
      name: "scale",
      rgb: BLUE,
      shape: "hv",
      legend: true,
    }),
    {
      type: "scatter",
      mode: "lines",
      name: "scale used",
      x: cols.xNext.slice(),
      y: cols.scaleLast,
      customdata: cols.cdScale,
      line: { color: "#0b57d0", width: 1.6, shape: "hv" },
      hovertemplate: "from step %{x}: %{customdata[0]}<br>%{customdata[1]}<extra>scale used</extra>",
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
        "overflow at step %{x}<br>scale %{customdata[2]} → %{customdata[0]}" +
        "<br>ranks with inf/NaN: %{customdata[1]}<br>loss: %{customdata[3]}" +
        "<br>parameters: %{customdata[4]} (click for them)<extra></extra>",
    },
    ...bandPair({
      x: cols.x,
      max: cols.trMax,
      min: cols.trMin,
      yaxis: "y2",
      name: "tracker",
      minName: "tracker min",
      rgb: GREEN,
    }),
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
    ...bandPair({ x: cols.x, max: cols.lossMax, min: cols.lossMin, yaxis: "y4", name: "loss", rgb: PURPLE }),
    {
      type: "scatter",
      mode: "lines",
      name: "loss",
      x: cols.x.slice(),
      y: cols.lossLast,
      yaxis: "y4",
      customdata: [],
      line: { color: "#6e40c9", width: 1.4 },
      hovertemplate: "step %{x}<br>loss %{y}<extra></extra>",
    },
    ...bandPair({ x: cols.x, max: cols.lrMax, min: cols.lrMin, yaxis: "y5", name: "learning rate", rgb: TEAL }),
    {
      type: "scatter",
      mode: "lines",
      name: "learning rate",
      x: cols.x.slice(),
      y: cols.lrLast,
      yaxis: "y5",
      customdata: [],
      line: { color: "#0a7c86", width: 1.4, shape: "hv" },
      hovertemplate: "step %{x}<br>learning rate %{y:.4~g}<extra></extra>",
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
    yaxis: { type: "log", title: { text: "loss scale" }, domain: [0.56, 1], fixedrange: true, anchor: "x" },
    yaxis4: { title: { text: "loss" }, domain: [0.39, 0.53], fixedrange: true, anchor: "x" },
    yaxis5: { title: { text: "lr" }, domain: [0.25, 0.36], fixedrange: true, exponentformat: "e", anchor: "x" },
    yaxis2: { title: { text: "tracker" }, domain: [0.13, 0.22], fixedrange: true, rangemode: "tozero", anchor: "x" },
    yaxis3: { title: { text: "skipped" }, domain: [0, 0.1], fixedrange: true, rangemode: "tozero", tickformat: ".1~%", anchor: "x" },
    shapes: [],
    annotations: [],
  };
}

// What the run's charts look like: traces, layout, axis ticks, and the
// per-bucket values they are built from. No data flow here; see chart.js.
// Top to bottom, on one step axis: the loss scale (y), the gradient norm (y6, a log axis
// as the scale's), the loss (y4), the learning rate (y5), the growth tracker (y2) and the
// skipped-step rate (y3).

import { formatNumber, formatScale } from "./dom.js";

const BLUE = "11,87,208";
const GREEN = "26,127,55";
const PURPLE = "110,64,201";
const TEAL = "10,124,134";
const ORANGE = "188,76,0";

// The charts, one row a group of traces, in drawing order: everything the columns, the
// buckets and the traces are made from. A band is a series of /steps: its min–max
// ("<band>_min", "<band>_max") and the line of its last value ("<band>_last"); a live step
// row gives them from its `fields` (the step fields that roll up into it, as the store
// declares them; `nullable`: a field that may be missing, shown as a gap). `line` is the
// band's line: its columns of x and customdata (`x`, `cd`), the points a bucket adds to
// them (`points`, if more than its last value), and how it looks.
export const CHARTS = [
  {
    band: "scale",
    fields: ["scale", "scale_after"],
    first: true, // a live row knows the scale its step used: the line starts from it
    x: "xFirst",
    yaxis: "y",
    rgb: BLUE,
    shape: "hv",
    legend: true,
    line: {
      name: "scale used",
      x: "xNext",
      cd: "cdScale",
      points: addScalePoints,
      line: { color: "#0b57d0", width: 1.6, shape: "hv" },
      hovertemplate: "from step %{x}: %{customdata[0]}<br>%{customdata[1]}<extra>scale used</extra>",
    },
  },
  { markers: "overflows" },
  { skips: "spike" },
  {
    band: "grad_norm",
    fields: ["grad_norm"],
    nullable: true,
    x: "x",
    yaxis: "y6",
    rgb: ORANGE,
    name: "gradient norm",
    line: {
      name: "gradient norm",
      x: "x",
      line: { color: "#bc4c00", width: 1.4 },
      hovertemplate: "step %{x}<br>gradient norm %{y:.4~g}<extra></extra>",
    },
  },
  {
    band: "tracker",
    fields: ["growth_tracker"],
    x: "x",
    yaxis: "y2",
    rgb: GREEN,
    minName: "tracker min",
    line: {
      name: "growth tracker",
      x: "x",
      cd: "cdTracker",
      points: (cols, b) => {
        cols.trackerLast.push(b.tracker_last);
        cols.cdTracker.push([b.first_step]);
      },
      line: { color: "#1a7f37", width: 1.4, shape: "hv" },
      hovertemplate: "steps %{customdata[0]}–%{x}<br>tracker %{y}<extra></extra>",
    },
  },
  { rate: "skipRate" },
  {
    band: "loss",
    fields: ["loss"],
    nullable: true,
    x: "x",
    yaxis: "y4",
    rgb: PURPLE,
    line: {
      name: "loss",
      x: "x",
      line: { color: "#6e40c9", width: 1.4 },
      hovertemplate: "step %{x}<br>loss %{y}<extra></extra>",
    },
  },
  { spikes: "grad_norm", yaxis: "y6" },
  { spikes: "loss", yaxis: "y4" },
  {
    band: "lr",
    fields: ["lr"],
    nullable: true,
    x: "x",
    yaxis: "y5",
    rgb: TEAL,
    name: "learning rate",
    line: {
      name: "learning rate",
      x: "x",
      line: { color: "#0a7c86", width: 1.4, shape: "hv" },
      hovertemplate: "step %{x}<br>learning rate %{y:.4~g}<extra></extra>",
    },
  },
];
const BANDS = CHARTS.filter((row) => row.band);

// Each trace's id and columns (`x`, `y`, `cd`: names in emptyColumns()), in trace order;
// the markers' trace has none (its points come from the overflow pages).
export const TRACE_COLUMNS = CHARTS.flatMap((row) => {
  if (row.markers) return [{ id: row.markers }];
  if (row.spikes) return [{ id: `${row.spikes}Spikes` }];
  if (row.skips) return [{ id: "spikeSkips", x: "xSpikeSkip", y: "spikeSkipY", cd: "cdSpikeSkip" }];
  if (row.rate) return [{ id: row.rate, x: "x", y: "rate" }];
  return [
    { id: `${row.band}Max`, x: row.x, y: `${row.band}Max` },
    { id: `${row.band}Min`, x: row.x, y: `${row.band}Min` },
    { id: `${row.band}Last`, x: row.line.x, y: `${row.band}Last`, cd: row.line.cd },
  ];
});
export const T = Object.fromEntries(TRACE_COLUMNS.map(({ id }, i) => [id, i]));
export const LINE_TRACES = TRACE_COLUMNS.flatMap((c, i) => (c.y ? [i] : []));
export const AUTORANGE_Y = {
  "yaxis.autorange": true,
  "yaxis2.autorange": true,
  "yaxis3.autorange": true,
  "yaxis4.autorange": true,
  "yaxis5.autorange": true,
  "yaxis6.autorange": true,
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
  const cols = { x: [], xFirst: [], xNext: [], rate: [] };
  for (const c of TRACE_COLUMNS) {
    if (c.x && !cols[c.x]) cols[c.x] = [];
    if (c.y) cols[c.y] = [];
    if (c.cd) cols[c.cd] = [];
  }
  return cols;
}

// The bucket ``i`` of a /steps answer's columnar ``series``: its steps, its skipped count
// and each band's min, max and last (null where the service sends none).
export function seriesBucket(series, i) {
  const bucket = { first_step: series.first_step[i], last_step: series.last_step[i], n: series.n[i] };
  bucket.skipped = series.skipped[i];
  bucket.spike_skips = series.spike_skips ? series.spike_skips[i] : 0; // an older service: none
  for (const { band } of BANDS) {
    for (const end of ["min", "max", "last"]) {
      const key = `${band}_${end}`;
      bucket[key] = series[key] ? series[key][i] : null;
    }
  }
  return bucket;
}

// A bucket's values, pushed onto the columns; ``rate`` is its rolling skipped-step rate, and
// ``first``: the first bucket of a drawing, where the scale line starts. A bucket with
// steps skipped for a spike adds a marker at its last step, on the scale it kept.
export function addBucket(cols, b, rate, first) {
  if (b.spike_skips > 0) {
    cols.xSpikeSkip.push(b.last_step);
    cols.spikeSkipY.push(b.scale_last);
    cols.cdSpikeSkip.push([b.spike_skips, b.first_step]);
  }
  cols.x.push(b.last_step);
  cols.xFirst.push(b.first_step);
  for (const { band, line } of BANDS) {
    cols[`${band}Min`].push(b[`${band}_min`]);
    cols[`${band}Max`].push(b[`${band}_max`]);
    if (line.points) line.points(cols, b, first);
    else cols[`${band}Last`].push(b[`${band}_last`]);
  }
  cols.rate.push(rate);
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
// pixels right of the last label kept, and clear of its text (``labelWidth(marker)``, in
// pixels: a long label is wider than the gap), at ``width`` pixels for the range: many
// changes close together keep their lines, and one label for a crowd, until zoomed in.
export function thinLabels(markers, [x0, x1], width, gap = 36, labelWidth = () => 0) {
  const perStep = width / Math.max(1e-9, x1 - x0);
  const kept = [];
  let free = -Infinity; // the first pixel right of the last label kept
  const inside = markers.filter((m) => m.step >= x0 && m.step <= x1).sort((a, b) => a.step - b.step);
  for (const m of inside) {
    const px = (m.step - x0) * perStep;
    if (px >= free) {
      kept.push(m);
      free = px + Math.max(gap, labelWidth(m));
    }
  }
  return kept;
}

// About how many pixels ``text`` takes in the chart's sans-serif at ``size`` px, with a
// margin: enough to keep two labels apart (an average glyph is ~0.6 of the size).
export function labelPixels(text, size = 11) {
  return Math.ceil(String(text).length * size * 0.62) + 6;
}

// One live step row, as its own one-step bucket: each band's min and max of its fields,
// and its last field's value.
export function stepAsBucket(row) {
  const bucket = { first_step: row.step, last_step: row.step, n: 1, skipped: row.skipped ? 1 : 0 };
  bucket.spike_skips = row.spike_skipped ? 1 : 0;
  for (const { band, fields, nullable, first } of BANDS) {
    const values = fields.map((field) => (nullable ? finiteOrNull(row[field]) : Number(row[field])));
    const present = values.filter((value) => value !== null);
    bucket[`${band}_min`] = present.length ? Math.min(...present) : null;
    bucket[`${band}_max`] = present.length ? Math.max(...present) : null;
    bucket[`${band}_last`] = values[values.length - 1];
    if (first) bucket[`${band}_first`] = values[0];
  }
  return bucket;
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
  // The chart's pages and live rows come without the parameters: not "–", which read as
  // none, but what a click shows.
  const params = item.params
    ? `${formatNumber(item.params.length + (item.params_omitted || 0))} (click for them)`
    : "not loaded yet (click the marker to list them)";
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

export function figureTraces(cols, overflows) {
  return CHARTS.flatMap((row) => {
    if (row.markers) return [overflowTrace(overflows)];
    if (row.spikes) return [spikeTrace(row)];
    if (row.skips) return [spikeSkipTrace(cols)];
    if (row.rate) return [rateTrace(cols)];
    const { band, line } = row;
    const pair = bandPair({
      x: cols[row.x],
      max: cols[`${band}Max`],
      min: cols[`${band}Min`],
      yaxis: row.yaxis,
      name: row.name || band,
      ...(row.minName ? { minName: row.minName } : {}),
      rgb: row.rgb,
      shape: row.shape,
      legend: row.legend,
    });
    const last = {
      type: "scatter",
      mode: "lines",
      name: line.name,
      x: cols[line.x].slice(),
      y: cols[`${band}Last`],
      ...(row.yaxis === "y" ? {} : { yaxis: row.yaxis }),
      customdata: line.cd ? cols[line.cd] : [],
      line: line.line,
      hovertemplate: line.hovertemplate,
    };
    return [...pair, last];
  });
}

function overflowTrace(overflows) {
  return {
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
      "<br>parameters: %{customdata[4]}<extra></extra>",
  };
}

const SPIKE_NAMES = { loss: "loss spike", grad_norm: "gradient-norm spike" };

// A spike's marker on its panel: the step, the value, its z (from /spikes).
export function spikePoint(item) {
  return { x: item.step, y: item.value, cd: [Number(item.z).toFixed(1)] };
}

// The markers of one kind of spike (``row.spikes``: loss or grad_norm) on its panel; the
// points come from /spikes (Chart.loadSpikes).
function spikeTrace(row) {
  const name = SPIKE_NAMES[row.spikes];
  return {
    type: "scatter",
    mode: "markers",
    name,
    x: [],
    y: [],
    yaxis: row.yaxis,
    customdata: [],
    marker: { symbol: "triangle-up", size: 9, color: "#cf222e" },
    hovertemplate: `step %{x}<br>${name}: %{y:.4~g} (z %{customdata[0]})<extra></extra>`,
  };
}

// Steps skipped for a spike (``skip_on_spike``), apart from overflows: a marker on the scale
// panel at a bucket's last step, at the scale it kept (a spike is not backed off for).
function spikeSkipTrace(cols) {
  return {
    type: "scatter",
    mode: "markers",
    name: "skipped for a spike",
    x: cols.xSpikeSkip.slice(),
    y: cols.spikeSkipY,
    customdata: cols.cdSpikeSkip,
    marker: { symbol: "diamond-open", size: 9, color: "#8a5300", line: { width: 2, color: "#8a5300" } },
    hovertemplate: "steps %{customdata[1]}–%{x}: %{customdata[0]} skipped for a spike<br>scale kept %{y}<extra></extra>",
  };
}

function rateTrace(cols) {
  return {
    type: "scatter",
    mode: "lines",
    name: "skipped-step rate",
    x: cols.x.slice(),
    y: cols.rate,
    yaxis: "y3",
    customdata: [],
    line: { color: "#8a5300", width: 1.4 },
    hovertemplate: "step %{x}<br>skipped %{y:.2%}<extra></extra>",
  };
}

// The panels under the scale are 40-60 px tall: Plotly's own choice (at least 3 ticks,
// then rounded to a nice step) put labels 10 px apart there, over each other. Asked for 2,
// it draws 2 or 3, clear of each other; the gradient norm's log axis is asked for 1 (under
// a decade Plotly ticks it linearly, 0.5 1 1.5, and 1 and 1.5 met; asked for 1 it keeps to
// a label or two).
const SMALL_PANEL_TICKS = 2;
const PANEL_DOMAINS = { grad_norm: [0.47, 0.57], loss: [0.34, 0.44], lr: [0.23, 0.31] };

// The panels of values a run may not record (the gradient norm, the loss, the learning
// rate), by band.
export const OPTIONAL_PANELS = [
  { band: "grad_norm", axis: "yaxis6", what: "gradient norm" },
  { band: "loss", axis: "yaxis4", what: "loss" },
  { band: "lr", axis: "yaxis5", what: "learning rate" },
];

// The optional panels with nothing to draw in ``cols``: their bands' names.
export function emptyPanels(cols) {
  return OPTIONAL_PANELS.filter(({ band }) => lossExtent([...cols[`${band}Min`], ...cols[`${band}Max`]]) === null).map(
    ({ band }) => band,
  );
}

// A panel with nothing to draw read as axes from -1 to 1 over nothing: its axis hidden
// instead, and a line in its place says what is not recorded (in the run, or in the
// steps of a zoomed ``view``). The relayout and the annotations of ``empty`` bands.
export function panelNotes(empty, view = null) {
  const layout = {};
  const notes = [];
  for (const { band, axis, what } of OPTIONAL_PANELS) {
    const none = empty.includes(band);
    layout[`${axis}.visible`] = !none;
    if (!none) continue;
    const [low, high] = PANEL_DOMAINS[band];
    notes.push({
      name: `unrecorded-${band}`,
      xref: "paper",
      yref: "paper",
      x: 0.5,
      y: (low + high) / 2,
      text: view ? `no ${what} recorded in steps ${formatNumber(view[0])}–${formatNumber(view[1])}` : `${what} not recorded by this run`,
      showarrow: false,
      font: { color: "#656d76", size: 12 },
    });
  }
  return { layout, notes };
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
    yaxis: { type: "log", title: { text: "loss scale" }, domain: [0.6, 1], fixedrange: true, anchor: "x" },
    yaxis6: { type: "log", title: { text: "grad norm" }, nticks: 1, tickformat: ".2~g", domain: PANEL_DOMAINS.grad_norm, fixedrange: true, anchor: "x" },
    yaxis4: { title: { text: "loss" }, nticks: SMALL_PANEL_TICKS, domain: PANEL_DOMAINS.loss, fixedrange: true, anchor: "x" },
    yaxis5: { title: { text: "lr" }, nticks: SMALL_PANEL_TICKS, domain: PANEL_DOMAINS.lr, fixedrange: true, exponentformat: "e", anchor: "x" },
    yaxis2: { title: { text: "tracker" }, nticks: SMALL_PANEL_TICKS, domain: [0.11, 0.2], fixedrange: true, rangemode: "tozero", anchor: "x" },
    yaxis3: { title: { text: "skipped" }, nticks: SMALL_PANEL_TICKS, domain: [0, 0.08], fixedrange: true, rangemode: "tozero", tickformat: ".1~%", anchor: "x" },
    shapes: [],
    annotations: [],
  };
}

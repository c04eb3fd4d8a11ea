// The run's charts: loss scale (log axis) over the loss, the learning rate, the growth tracker and
// the rolling skipped-step rate, one shared step axis. Buckets come from
// /steps (min, max, last per bucket, so no spike is ever averaged away); live
// steps are appended with Plotly.extendTraces; zoom re-queries finer buckets.

import { getJSON, isBusy, paths } from "./api.js";
import {
  AUTORANGE_Y,
  LINE_TRACES,
  RollingRate,
  T,
  TRACE_COLUMNS,
  addBucket,
  emptyColumns,
  emptyPanels,
  extent,
  figureLayout,
  figureTraces,
  spikePoint,
  labelPixels,
  lossExtent,
  overflowPoint,
  panelNotes,
  powerTicks,
  seriesBucket,
  stepAsBucket,
  thinLabels,
} from "./chart_figure.js";

const Plotly = window.Plotly;
const MIN_WINDOW = 200; // steps in the rolling skipped-step rate
const REQUERY_DELAY_MS = 300;
const FLUSH_MS = 100;
const COMPACT_AFTER = 5000; // live points appended before the whole run is re-bucketed
const OVERFLOW_PAGE = 1000;
const BEFORE_POINTS = 1000; // buckets of the steps before a zoomed view, for its rolling rate
const MAX_COARSEN = 16; // a busy service is asked for at most 16 times fewer buckets
const BEFORE_FIRST_STEP = -1; // the last step drawn when none is: every step is after it

export class RunChart {
  constructor(node, runId, { onInfo, onError, onOverflow, onLiveOverflow } = {}) {
    this.node = node;
    this.runId = runId;
    this.onInfo = onInfo || (() => {});
    this.onError = onError || (() => {});
    this.onOverflow = onOverflow || (() => {}); // an overflow marker clicked: its step
    this.onLiveOverflow = onLiveOverflow || (() => {});
    this.view = null; // null: the whole run; else [start, end] in steps
    this.lastStep = BEFORE_FIRST_STEP; // last step drawn
    this.pending = []; // live step rows not drawn yet
    this.loading = null; // AbortController of the bucket query in flight
    this.ready = false;
    this.appended = 0;
    this.rate = new RollingRate(MIN_WINDOW);
    this.bucketWidth = 1;
    this.overflowSteps = new Set();
    this.markers = [];
    this.alertMarks = []; // alerts of the run: { id, rule, from, to, text }, see alerts.js
    this.loadMarks = []; // loads of the scaler's state: { id, step, jump, text }, see scale_loads.js
    this.drawnMarkers = null; // what applyMarkers last drew, so that it redraws only a change
    this.empty = []; // the optional panels (loss, lr) with nothing drawn: see panelNotes
    this.panelNotes = [];
    this.scaleExtent = [Infinity, -Infinity]; // of the whole run drawn
    this.shown = null; // a zoomed view drawn, and its y ranges: { view, scales, tracker, rate }
    this.plotted = false;
    this.requeryTimer = null;
    this.flushTimer = null;
    this.coarsen = 1; // > 1 while the service is busy: buckets asked for, divided by this
    this.coalesced = 0; // live steps the stream left out while busy (read back as buckets)
  }

  async start() {
    const narrow = (this.node.clientWidth || 1000) < 600;
    await Plotly.newPlot(this.node, figureTraces(emptyColumns(), []), figureLayout(narrow), {
      responsive: true,
      displaylogo: false,
      // On a phone the mode bar would cover the top of the chart; double-tap still resets.
      displayModeBar: narrow ? false : "hover",
      modeBarButtonsToRemove: ["lasso2d", "select2d"],
    });
    this.node.on("plotly_relayout", (event) => this.onRelayout(event));
    this.node.on("plotly_click", (event) => {
      const point = (event.points || []).find((p) => p.curveNumber === T.overflows);
      if (point) this.onOverflow(point.x);
    });
    this.plotted = true;
    if (this.hasMarkers()) this.applyMarkers();
    await Promise.all([this.loadBuckets(), this.loadOverflows(), this.loadSpikes()]);
  }
  onRelayout(event) {
    if (event["xaxis.autorange"] || event.autosize) {
      if (event["xaxis.autorange"]) this.setView(null);
      return;
    }
    let range = null;
    if ("xaxis.range[0]" in event && "xaxis.range[1]" in event) {
      range = [event["xaxis.range[0]"], event["xaxis.range[1]"]];
    } else if (Array.isArray(event["xaxis.range"])) {
      range = event["xaxis.range"];
    }
    if (range) this.setView([Math.max(0, Math.floor(range[0])), Math.ceil(range[1])]);
  }

  setView(view, { keepCoarse = false } = {}) {
    this.view = view;
    if (!keepCoarse) this.coarsen = 1;
    clearTimeout(this.requeryTimer);
    this.requeryTimer = setTimeout(() => {
      this.loadBuckets().catch((error) => this.onError(error));
    }, REQUERY_DELAY_MS);
  }

  maxPoints() {
    const full = Math.min(4000, Math.max(100, Math.round(this.node.clientWidth || 1000)));
    return Math.max(2, Math.round(full / this.coarsen));
  }

  // The service was too busy to start the query (503): ask again when it says, for
  // coarser buckets (fewer rows to read), and say so.
  retryCoarser(error) {
    this.coarsen = Math.min(this.coarsen * 4, MAX_COARSEN);
    this.onInfo({ bucketWidth: this.bucketWidth, view: this.view, busy: true, coarse: this.coarsen > 1 });
    clearTimeout(this.requeryTimer);
    this.requeryTimer = setTimeout(() => {
      this.loadBuckets().catch((failure) => this.onError(failure));
    }, 1000 * Math.max(1, error.retryAfter));
  }

  // The live stream skipped steps while the service was busy (they are in the store):
  // the view is read again, as buckets, so the gap is drawn.
  addCoalesced(gap) {
    this.coalesced += Math.max(0, gap.to - gap.after);
    this.setView(this.view, { keepCoarse: true });
  }

  async loadBuckets() {
    if (this.loading) this.loading.abort();
    const controller = new AbortController();
    this.loading = controller;
    const view = this.view;
    try {
      const body = await getJSON(
        paths.steps(this.runId, {
          start: view ? view[0] : undefined,
          end: view ? view[1] : undefined,
          maxPoints: this.maxPoints(),
        }),
        { signal: controller.signal },
      );
      const before = view && view[0] > 0 ? await this.loadBefore(view[0], body, controller.signal) : null;
      if (controller.signal.aborted) return;
      await this.drawBuckets(body, before);
    } catch (error) {
      if (isBusy(error)) this.retryCoarser(error);
      else if (error.name !== "AbortError") throw error;
    } finally {
      if (this.loading === controller) this.loading = null;
    }
    this.scheduleFlush();
  }

  // The steps of one rate window before a zoomed view: its rolling skipped-step rate
  // starts from them, not from nothing at the view's left edge.
  async loadBefore(start, body, signal) {
    const window = Math.max(MIN_WINDOW, Number(body.bucket_width) || 1);
    const query = { start: Math.max(0, start - window), end: start - 1, maxPoints: BEFORE_POINTS };
    return (await getJSON(paths.steps(this.runId, query), { signal })).series;
  }

  async drawBuckets(body, before = null) {
    const s = body.series;
    this.bucketWidth = Math.max(1, Number(body.bucket_width) || 1);
    this.rate = new RollingRate(Math.max(MIN_WINDOW, this.bucketWidth));
    for (let i = 0; before && i < before.last_step.length; i += 1) {
      this.rate.push(before.last_step[i], before.n[i], before.skipped[i]);
    }
    const cols = emptyColumns();
    for (let i = 0; i < s.last_step.length; i += 1) {
      const bucket = seriesBucket(s, i);
      addBucket(cols, bucket, this.rate.push(bucket.last_step, bucket.n, bucket.skipped), i === 0);
    }
    // Live steps after the last bucket still append, also beyond a zoomed view.
    this.lastStep = cols.x.length ? cols.x[cols.x.length - 1] : BEFORE_FIRST_STEP;
    this.pending = this.pending.filter((row) => row.step > this.lastStep);
    this.appended = 0;
    const fresh = figureTraces(cols, []);
    const update = { x: [], y: [], customdata: [] };
    for (const index of LINE_TRACES) {
      update.x.push(fresh[index].x);
      update.y.push(fresh[index].y);
      update.customdata.push(fresh[index].customdata);
    }
    await Plotly.restyle(this.node, update, LINE_TRACES);
    this.scaleExtent = extent([...cols.scaleMin, ...cols.scaleMax, ...this.node.data[T.overflows].y]);
    this.shown = this.view ? this.viewShown(cols) : null;
    await Plotly.relayout(this.node, this.shown ? this.shownLayout() : { ...AUTORANGE_Y, ...powerTicks(this.scaleExtent) });
    await this.showEmptyPanels(emptyPanels(cols));
    const rateName = `skipped-step rate (last ${this.rate.window} steps)`;
    if (this.node.data[T.skipRate].name !== rateName) {
      await Plotly.restyle(this.node, { name: rateName }, [T.skipRate]);
    }
    this.ready = true;
    this.node.dataset.view = this.view ? this.view.join("-") : "all";
    this.node.dataset.bucketWidth = String(this.bucketWidth);
    this.updateCounts();
    this.onInfo({
      bucketWidth: this.bucketWidth,
      view: this.view,
      points: cols.x.length,
      coarse: this.coarsen > 1,
    });
    if (this.hasMarkers()) this.applyMarkers(); // labels thinned for the range now shown
  }

  // Plotly autoranges y over every point of a trace, not the visible ones, so a
  // zoomed view gets its y ranges (and its scale ticks) from the buckets and the
  // overflows inside it.
  viewShown(cols) {
    const [start, end] = this.view;
    const overflows = this.node.data[T.overflows];
    const scales = [...cols.scaleMin, ...cols.scaleMax];
    overflows.x.forEach((step, i) => {
      if (step >= start && step <= end) scales.push(overflows.y[i]);
    });
    return {
      view: [start, end],
      scales: extent(scales),
      tracker: Math.max(1, ...cols.trackerMax),
      rate: Math.max(0.01, ...cols.rate),
      losses: lossExtent([...cols.lossMin, ...cols.lossMax]),
      rates: lossExtent([...cols.lrMin, ...cols.lrMax]),
    };
  }

  shownLayout() {
    const { scales, tracker, rate, losses, rates } = this.shown;
    if (!(scales[0] > 0)) return { ...AUTORANGE_Y, ...powerTicks(this.scaleExtent) };
    const lo = Math.log10(scales[0]);
    const hi = Math.log10(scales[1]);
    const pad = Math.max(0.1, (hi - lo) * 0.06);
    const lossPad = losses ? Math.max(1e-6, (losses[1] - losses[0]) * 0.06) : 0;
    const ratePad = rates ? Math.max(rates[1] * 0.06, (rates[1] - rates[0]) * 0.06, 1e-12) : 0;
    return {
      "yaxis.range": [lo - pad, hi + pad],
      "yaxis2.range": [0, tracker * 1.08],
      "yaxis3.range": [0, rate * 1.08],
      ...(losses ? { "yaxis4.range": [losses[0] - lossPad, losses[1] + lossPad] } : { "yaxis4.autorange": true }),
      ...(rates ? { "yaxis5.range": [rates[0] - ratePad, rates[1] + ratePad] } : { "yaxis5.autorange": true }),
      "yaxis6.autorange": true, // a log axis: Plotly's own range of the norms
      ...powerTicks(scales),
    };
  }

  // Live steps inside a zoomed view widen its y ranges when they fall outside them.
  widenShown(cols) {
    const [start, end] = this.shown.view; // the view drawn, which a new one replaces only once drawn
    const inside = cols.x.map((step, i) => (step >= start && step <= end ? i : -1)).filter((i) => i >= 0);
    if (!inside.length) return;
    const before = this.shown;
    const scales = extent(inside.flatMap((i) => [cols.scaleMin[i], cols.scaleMax[i]]), before.scales);
    const tracker = Math.max(before.tracker, ...inside.map((i) => cols.trackerMax[i]));
    const rate = Math.max(before.rate, ...inside.map((i) => cols.rate[i]));
    const losses = lossExtent(inside.flatMap((i) => [cols.lossMin[i], cols.lossMax[i]]), before.losses);
    const rates = lossExtent(inside.flatMap((i) => [cols.lrMin[i], cols.lrMax[i]]), before.rates);
    const sameLoss = String(losses) === String(before.losses) && String(rates) === String(before.rates);
    if (scales[0] === before.scales[0] && scales[1] === before.scales[1] && tracker === before.tracker && rate === before.rate && sameLoss) {
      return;
    }
    this.shown = { ...before, scales, tracker, rate, losses, rates };
    Plotly.relayout(this.node, this.shownLayout());
  }

  async loadOverflows() {
    let after = null;
    for (;;) {
      // The markers' parameters come with a click (an overflow may have hundreds).
      const page = await getJSON(paths.overflows(this.runId, after, OVERFLOW_PAGE, { params: false }));
      this.appendOverflows(page.items || []);
      if (page.next === null || page.next === undefined || !(page.items || []).length) break;
      after = page.next;
    }
  }

  // The loss and gradient-norm spikes, each a marker on its panel (found as steps are
  // stored; read again with each live batch that may hold new ones).
  async loadSpikes() {
    const body = await getJSON(paths.spikes(this.runId));
    const update = { x: [], y: [], customdata: [] };
    const traces = [];
    for (const what of ["loss", "grad_norm"]) {
      const points = (body.items || []).filter((item) => item.what === what).map(spikePoint);
      update.x.push(points.map((p) => p.x));
      update.y.push(points.map((p) => p.y));
      update.customdata.push(points.map((p) => p.cd));
      traces.push(T[`${what}Spikes`]);
    }
    this.node.dataset.spikes = String((body.items || []).length);
    await Plotly.restyle(this.node, update, traces);
  }

  appendOverflows(items) {
    const points = items.filter((item) => !this.overflowSteps.has(item.step)).map(overflowPoint);
    if (!points.length) return;
    for (const p of points) this.overflowSteps.add(p.x);
    Plotly.extendTraces(
      this.node,
      { x: [points.map((p) => p.x)], y: [points.map((p) => p.y)], customdata: [points.map((p) => p.cd)] },
      [T.overflows],
    );
  }

  // A step row from the server-sent event stream.
  addLiveStep(row) {
    if (row.step <= this.lastStep) return;
    this.pending.push(row);
    this.scheduleFlush();
  }

  scheduleFlush() {
    if (this.flushTimer === null) this.flushTimer = setTimeout(() => this.flush(), FLUSH_MS);
  }

  flush() {
    this.flushTimer = null;
    if (!this.ready || this.loading || !this.pending.length) return;
    const rows = this.pending.filter((row) => row.step > this.lastStep).sort((a, b) => a.step - b.step);
    this.pending = [];
    if (!rows.length) return;
    const cols = emptyColumns();
    const starts = this.lastStep === BEFORE_FIRST_STEP; // the scale line starts at the first row
    rows.forEach((row, i) => {
      const bucket = stepAsBucket(row);
      addBucket(cols, bucket, this.rate.push(bucket.last_step, bucket.n, bucket.skipped), starts && i === 0);
    });
    this.lastStep = rows[rows.length - 1].step;
    const traces = LINE_TRACES.map((i) => TRACE_COLUMNS[i]);
    Plotly.extendTraces(
      this.node,
      {
        x: traces.map((c) => cols[c.x]),
        y: traces.map((c) => cols[c.y]),
        customdata: traces.map((c) => (c.cd ? cols[c.cd] : [])),
      },
      LINE_TRACES,
    );
    const overflows = rows.filter((row) => row.overflow);
    if (overflows.length) {
      this.appendOverflows(overflows);
      this.onLiveOverflow();
    }
    if (rows.some((row) => row.loss_spike || row.grad_norm_spike)) {
      this.loadSpikes().catch(this.onError); // a live step flagged as a spike: its marker
    }
    const wider = extent([...cols.scaleMin, ...cols.scaleMax], this.scaleExtent);
    const widened = wider[0] !== this.scaleExtent[0] || wider[1] !== this.scaleExtent[1];
    this.scaleExtent = wider;
    if (this.shown) this.widenShown(cols);
    else if (widened) Plotly.relayout(this.node, powerTicks(wider));
    const filled = emptyPanels(cols);
    if (this.empty.some((band) => !filled.includes(band))) {
      this.showEmptyPanels(this.empty.filter((band) => filled.includes(band))).catch(this.onError);
    }
    this.appended += rows.length;
    if (!this.view && this.hasMarkers()) this.applyMarkers(); // more steps in as many pixels
    this.updateCounts();
    if (!this.view && this.appended > COMPACT_AFTER) this.setView(null);
  }

  // Applied control changes, as vertical dashed lines across all three charts.
  setMarkers(markers) {
    const key = JSON.stringify(markers);
    if (key === this.markersKey) return;
    this.markersKey = key;
    this.markers = markers;
    if (this.plotted) this.applyMarkers();
  }

  // Alerts, as a red band from the step each fired to the step it resolved (or the last).
  setAlertMarkers(marks) {
    const key = JSON.stringify(marks);
    if (key === this.alertMarksKey) return;
    this.alertMarksKey = key;
    this.alertMarks = marks;
    if (this.plotted) this.applyMarkers();
  }

  // Loads of the scaler's state, as a line across the scale panel at the step loaded:
  // solid red where the scale jumped, dotted grey where it did not.
  setLoadMarks(marks) {
    const key = JSON.stringify(marks);
    if (key === this.loadMarksKey) return;
    this.loadMarksKey = key;
    this.loadMarks = marks;
    if (this.plotted) this.applyMarkers();
  }

  // Hide the optional panels with nothing drawn (``empty``), and say so where they are.
  async showEmptyPanels(empty) {
    const key = JSON.stringify([empty, this.view]);
    if (key === this.emptyKey) return;
    this.emptyKey = key;
    this.empty = empty;
    const { layout, notes } = panelNotes(empty, this.view);
    this.panelNotes = notes;
    await Plotly.relayout(this.node, layout);
    this.node.dataset.unrecorded = empty.join(" ");
    this.applyMarkers();
  }

  hasMarkers() {
    return this.markers.length > 0 || this.alertMarks.length > 0 || this.loadMarks.length > 0;
  }

  // The scale panel's lines and labels of the loads (see setLoadMarks).
  loadShapes() {
    const lines = this.loadMarks.map((m) => ({
      type: "line",
      name: `scale-load-${m.id}`,
      xref: "x",
      yref: "y domain",
      x0: m.step,
      x1: m.step,
      y0: 0,
      y1: 1,
      line: m.jump ? { color: "#d1242f", width: 2 } : { color: "rgba(101,109,118,0.55)", width: 1, dash: "dot" },
    }));
    const [x0, x1] = this.xRange();
    const labelText = (m) => (m.jump ? "⇅ scale loaded" : "loaded");
    const labels = thinLabels(this.loadMarks, [x0, x1], this.plotWidth(), 36, (m) =>
      labelPixels(labelText(m)),
    ).map((m) => ({
      xref: "x",
      yref: "y domain",
      x: m.step,
      y: 0,
      xanchor: m.step > x0 + 0.85 * (x1 - x0) ? "right" : "left", // near the right edge: inside it
      yanchor: "bottom",
      text: labelText(m),
      hovertext: m.text,
      showarrow: false,
      font: { color: m.jump ? "#d1242f" : "#656d76", size: 11 },
    }));
    return { lines, labels };
  }

  applyMarkers() {
    const markers = this.markers;
    const bands = this.alertMarks.map((a) => ({
      type: "rect",
      name: `alert-${a.id}`,
      xref: "x",
      yref: "paper",
      x0: a.from,
      x1: Math.max(a.from, a.to ?? this.lastStep),
      y0: 0,
      y1: 1,
      layer: "below",
      fillcolor: "rgba(207, 34, 46, 0.10)",
      line: { color: "rgba(207, 34, 46, 0.7)", width: 1 },
    }));
    const alertLabels = thinLabels(
      this.alertMarks.map((a) => ({ ...a, step: a.from })),
      this.xRange(),
      this.plotWidth(),
      36,
      (a) => labelPixels(`⚠ ${a.rule}`),
    ).map((a) => ({
      xref: "x",
      yref: "paper",
      x: a.from,
      y: 0,
      xanchor: "left",
      yanchor: "bottom",
      text: `⚠ ${a.rule}`,
      hovertext: a.text,
      showarrow: false,
      font: { color: "#cf222e", size: 11 },
    }));
    const shapes = markers.map((m) => ({
      type: "line",
      name: `control-${m.id}`,
      xref: "x",
      yref: "paper",
      x0: m.step,
      x1: m.step,
      y0: 0,
      y1: 1,
      line: { color: "#6e40c9", width: 1.5, dash: "dash" },
    }));
    const annotations = thinLabels(markers, this.xRange(), this.plotWidth()).map((m) => ({
      xref: "x",
      yref: "paper",
      x: m.step,
      y: 1,
      yanchor: "bottom",
      text: `#${m.id}`,
      hovertext: `#${m.id} at step ${m.step}: ${m.label}`,
      showarrow: false,
      font: { color: "#6e40c9", size: 11 },
    }));
    const loads = this.loadShapes();
    const key = JSON.stringify([shapes.length, annotations.map((a) => a.text), bands, alertLabels, loads, this.panelNotes]);
    if (key === this.drawnMarkers) return;
    this.drawnMarkers = key;
    Plotly.relayout(this.node, {
      shapes: [...bands, ...shapes, ...loads.lines],
      annotations: [...alertLabels, ...annotations, ...loads.labels, ...this.panelNotes],
    });
    this.node.dataset.markers = String(shapes.length);
    this.node.dataset.labels = String(annotations.length);
    this.node.dataset.alertMarkers = String(bands.length);
    this.node.dataset.scaleLoads = String(loads.lines.length);
    this.node.dataset.scaleJumps = String(this.loadMarks.filter((m) => m.jump).length);
  }

  // The steps shown: the zoomed view, else the whole run (its steps and its marks). Not the
  // range Plotly last wrote into the layout: while a redraw is in flight that is still the
  // empty plot's, or one autoranged over the shapes alone, and labels thinned for it are lost.
  xRange() {
    if (this.view) return [this.view[0], this.view[1]];
    const steps = [
      ...this.markers.map((m) => m.step),
      ...this.alertMarks.map((a) => a.from),
      ...this.loadMarks.map((m) => m.step),
    ];
    return [Math.min(0, ...steps), Math.max(this.lastStep, ...steps)];
  }

  plotWidth() {
    const axis = this.node._fullLayout && this.node._fullLayout.xaxis; // the plot area, in pixels
    return (axis && axis._length) || Math.max(100, (this.node.clientWidth || 1000) - 82);
  }

  updateCounts() {
    this.node.dataset.points = String(this.node.data[T.scaleLast].x.length);
    this.node.dataset.lastStep = String(this.lastStep);
  }
}

// The chart's pure parts: axis ticks, the rolling skipped-step rate, buckets from live rows.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  CHARTS,
  LINE_TRACES,
  RollingRate,
  T,
  TRACE_COLUMNS,
  addBucket,
  bandPair,
  emptyColumns,
  emptyPanels,
  extent,
  figureLayout,
  figureTraces,
  firstScale,
  labelPixels,
  lossExtent,
  lossFlag,
  overflowPoint,
  panelNotes,
  powerTicks,
  seriesBucket,
  spikePoint,
  stepAsBucket,
  thinLabels,
} from "../chart_figure.js";

test("powerTicks ticks the log axis at powers of two", () => {
  assert.deepEqual(powerTicks([2 ** 10, 2 ** 16]), {
    "yaxis.tickmode": "array",
    "yaxis.tickvals": [2 ** 10, 2 ** 11, 2 ** 12, 2 ** 13, 2 ** 14, 2 ** 15, 2 ** 16],
    "yaxis.ticktext": [10, 11, 12, 13, 14, 15, 16].map((k) => `2<sup>${k}</sup>`),
  });
});

test("powerTicks widens a single power to the ones either side", () => {
  assert.deepEqual(powerTicks([65536, 65536])["yaxis.tickvals"], [2 ** 15, 2 ** 16, 2 ** 17]);
  // Not a power itself: the two powers around it.
  assert.deepEqual(powerTicks([3, 3])["yaxis.tickvals"], [2, 4]);
});

test("powerTicks keeps at most about 8 ticks on a wide range", () => {
  const ticks = powerTicks([2 ** -20, 2 ** 40])["yaxis.tickvals"];
  assert.ok(ticks.length <= 9, `${ticks.length} ticks`);
  assert.deepEqual(ticks.slice(0, 2), [2 ** -16, 2 ** -8]);
  assert.equal(ticks.at(-1), 2 ** 40);
});

test("powerTicks gives nothing for an empty or non-positive extent", () => {
  assert.deepEqual(powerTicks([Infinity, -Infinity]), {});
  assert.deepEqual(powerTicks([0, 8]), {});
  assert.deepEqual(powerTicks([NaN, 8]), {});
});

test("RollingRate is the skipped share of the last window of steps", () => {
  const rate = new RollingRate(10);
  assert.equal(rate.push(4, 5, 1), 1 / 5);
  assert.equal(rate.push(9, 5, 0), 1 / 10);
  // Step 14 ends a window of steps 5..14: the bucket that ended at step 4 leaves it.
  assert.equal(rate.push(14, 5, 5), 5 / 10);
  assert.equal(rate.push(30, 1, 0), 0);
});

test("RollingRate keeps the last bucket even when it is wider than the window", () => {
  const rate = new RollingRate(10);
  rate.push(99, 100, 50);
  assert.equal(rate.push(199, 100, 25), 0.25);
});

test("RollingRate of no steps is 0", () => {
  assert.equal(new RollingRate(10).push(0, 0, 0), 0);
});

test("RollingRate gives the same rates after it compacts its entries", () => {
  const rate = new RollingRate(3);
  let last = 0;
  for (let step = 0; step < 10_000; step += 1) last = rate.push(step, 1, step % 2);
  assert.ok(rate.entries.length - rate.head <= 4100);
  assert.equal(last, 2 / 3); // steps 9997..9999: two skipped
});

test("extent ignores non-positive values for the low end", () => {
  assert.deepEqual(extent([0, 4, 2, -1, 8]), [2, 8]);
  assert.deepEqual(extent([], [1, 2]), [1, 2]);
  assert.deepEqual(extent([16], [2, 8]), [2, 16]);
});

test("stepAsBucket and firstScale: a live row is a one-step bucket", () => {
  const bucket = stepAsBucket({ step: 7, scale: "65536", scale_after: 32768, growth_tracker: 0, skipped: true });
  assert.deepEqual(bucket, {
    first_step: 7,
    last_step: 7,
    n: 1,
    scale_first: 65536,
    scale_min: 32768,
    scale_max: 65536,
    scale_last: 32768,
    tracker_min: 0,
    tracker_max: 0,
    tracker_last: 0,
    skipped: 1,
    spike_skips: 0,
    loss_min: null,
    loss_max: null,
    loss_last: null,
    lr_min: null,
    lr_max: null,
    lr_last: null,
    grad_norm_min: null,
    grad_norm_max: null,
    grad_norm_last: null,
  });
  assert.equal(firstScale(bucket), 65536);
  // A one-step bucket from /steps has no scale_first: the scale it did not end with.
  assert.equal(firstScale({ n: 1, scale_min: 2, scale_max: 4, scale_last: 2 }), 4);
  assert.equal(firstScale({ n: 1, scale_min: 2, scale_max: 4, scale_last: 4 }), 2);
  assert.equal(firstScale({ n: 5, scale_min: 2, scale_max: 4, scale_last: 4 }), 4);
});

test("thinLabels keeps labels at least `gap` pixels apart, inside the range", () => {
  const markers = [0, 1, 2, 50, 100, 200].map((step) => ({ step }));
  const kept = thinLabels(markers, [0, 100], 100, 36).map((m) => m.step);
  assert.deepEqual(kept, [0, 50, 100]);
});

test("thinLabels keeps a long label's neighbour clear of its text", () => {
  // Two alert bands 40 px apart: "⚠ rank_hotspot" is ~100 px wide, so the second label
  // would print inside the first ("rank_ho⚠spot").
  const alerts = [{ step: 0, rule: "rank_hotspot" }, { step: 40, rule: "skip_rate" }, { step: 200, rule: "skip_rate" }];
  const width = (a) => labelPixels(`⚠ ${a.rule}`);
  assert.ok(width(alerts[0]) > 40);
  assert.deepEqual(thinLabels(alerts, [0, 1000], 1000, 36, width).map((a) => a.step), [0, 200]);
  assert.deepEqual(thinLabels(alerts, [0, 1000], 1000, 36).map((a) => a.step), [0, 40, 200]);
});

test("a live row's loss is its bucket's min, max and last; a missing one is a gap", () => {
  const row = { step: 3, scale: 8, scale_after: 8, growth_tracker: 1, skipped: false };
  const seen = stepAsBucket({ ...row, loss: 2.5 });
  assert.deepEqual([seen.loss_min, seen.loss_max, seen.loss_last], [2.5, 2.5, 2.5]);
  for (const loss of [null, undefined, "2.5", Infinity]) {
    const gap = stepAsBucket({ ...row, loss });
    assert.deepEqual([gap.loss_min, gap.loss_max, gap.loss_last], [null, null, null]);
  }
});

test("lossExtent spans the finite losses only", () => {
  assert.deepEqual(lossExtent([null, 3, -1, NaN, Infinity, 2]), [-1, 3]);
  assert.equal(lossExtent([null, null]), null);
  assert.deepEqual(lossExtent([5], [1, 2]), [1, 5]);
  assert.deepEqual(lossExtent([null], [1, 2]), [1, 2]);
});

test("the loss is drawn under the scale, on its own axis, as a band and a line", () => {
  const cols = emptyColumns();
  cols.x.push(10, 20);
  cols.lossMin.push(1, null);
  cols.lossMax.push(4, null);
  cols.lossLast.push(2, null);
  const traces = figureTraces(cols, []);
  assert.deepEqual(
    [T.lossMax, T.lossMin, T.lossLast].map((i) => [traces[i].yaxis, traces[i].y]),
    [["y4", [4, null]], ["y4", [1, null]], ["y4", [2, null]]],
  );
  assert.ok(LINE_TRACES.includes(T.lossLast));
  const layout = figureLayout(false);
  assert.ok(layout.yaxis4.domain[1] < layout.yaxis.domain[0], "under the scale");
  assert.ok(layout.yaxis4.domain[0] > layout.yaxis2.domain[1], "above the tracker");
});

test("a live row's learning rate is its bucket's min, max and last", () => {
  const seen = stepAsBucket({ step: 3, scale: 2, scale_after: 2, growth_tracker: 0, skipped: false, lr: 0.001 });
  assert.deepEqual([seen.lr_min, seen.lr_max, seen.lr_last], [0.001, 0.001, 0.001]);
  const gap = stepAsBucket({ step: 3, scale: 2, scale_after: 2, growth_tracker: 0, skipped: false, lr: null });
  assert.deepEqual([gap.lr_min, gap.lr_max, gap.lr_last], [null, null, null]);
});

test("the learning rate is drawn under the loss, on its own axis, as a band and a line", () => {
  const cols = emptyColumns();
  cols.x.push(10, 20);
  cols.lrMin.push(0.001, null);
  cols.lrMax.push(0.002, null);
  cols.lrLast.push(0.0015, null);
  const traces = figureTraces(cols, []);
  assert.deepEqual(
    [T.lrMax, T.lrMin, T.lrLast].map((i) => [traces[i].yaxis, traces[i].y]),
    [["y5", [0.002, null]], ["y5", [0.001, null]], ["y5", [0.0015, null]]],
  );
  assert.ok(LINE_TRACES.includes(T.lrLast) && LINE_TRACES.includes(T.lrMin));
  assert.equal(traces.length, Object.keys(T).length, "every trace has its index in T");
  const layout = figureLayout(false);
  assert.ok(layout.yaxis5.domain[1] < layout.yaxis4.domain[0], "under the loss");
  assert.ok(layout.yaxis5.domain[0] > layout.yaxis2.domain[1], "above the tracker");
});

test("each min–max band is its max line, then its min filled up to it, hover skipped", () => {
  const cols = emptyColumns();
  cols.x.push(10, 20);
  cols.xFirst.push(1, 11);
  const traces = figureTraces(cols, []);
  const bands = [
    [T.scaleMax, T.scaleMin, "y", cols.xFirst, "hv"],
    [T.trackerMax, T.trackerMin, "y2", cols.x, undefined],
    [T.lossMax, T.lossMin, "y4", cols.x, undefined],
    [T.lrMax, T.lrMin, "y5", cols.x, undefined],
  ];
  for (const [max, min, yaxis, x, shape] of bands) {
    const [top, bottom] = [traces[max], traces[min]];
    assert.deepEqual([top.fill, bottom.fill], ["none", "tonexty"]);
    for (const trace of [top, bottom]) {
      assert.deepEqual([trace.yaxis, trace.x, trace.hoverinfo], [yaxis, x, "skip"]);
      assert.deepEqual([trace.line.width, trace.line.shape, trace.line.color], [0, shape, top.line.color]);
      assert.notEqual(trace.x, x, "its own copy: extendTraces grows each trace's x");
    }
  }
  assert.deepEqual(
    traces.filter((t) => t.fill === "tonexty" && t.showlegend).map((t) => t.name),
    ["scale min–max"],
  );
  const [, named] = bandPair({ x: [1], max: [2], min: [0], yaxis: "y9", name: "n", rgb: "1,2,3" });
  assert.equal(named.name, "n min–max");
});

test("an overflow marker says whether the loss was finite and how many parameters", () => {
  const item = { step: 9, scale: 1024, scale_after: 512, inf_ranks: [1] };
  const page = overflowPoint({ ...item, loss_nonfinite_ranks: [], params: [{}, {}], params_omitted: 3 });
  assert.deepEqual(page.cd.slice(3), ["finite", "5 (click for them)"]);
  const live = overflowPoint({ ...item, loss_nonfinite_ranks: [0, 2] });
  // Not "–", which reads as none: the parameters are one click away.
  assert.deepEqual(live.cd.slice(3), ["not finite on ranks 0, 2", "not loaded yet (click the marker to list them)"]);
  assert.equal(lossFlag({ loss_nonfinite_ranks: [1] }), "not finite on rank 1");
});

// A /steps answer of one bucket: each series' key holds a value of its own.
function oneBucketSeries() {
  const series = { first_step: [11], last_step: [18], n: [8], skipped: [2] };
  let value = 100;
  for (const { band } of CHARTS.filter((row) => row.band)) {
    for (const end of ["min", "max", "last"]) series[`${band}_${end}`] = [(value += 1)];
  }
  return series;
}

test("one table drives the columns, the buckets and the traces", () => {
  const series = oneBucketSeries();
  const cols = emptyColumns();
  const bucket = seriesBucket(series, 0);
  addBucket(cols, bucket, 0.25, false);
  const traces = figureTraces(cols, []);
  assert.equal(traces.length, TRACE_COLUMNS.length);
  assert.deepEqual(LINE_TRACES, TRACE_COLUMNS.flatMap((c, i) => (c.y ? [i] : [])));
  for (const row of CHARTS.filter((r) => r.band)) {
    const [max, min, last] = [T[`${row.band}Max`], T[`${row.band}Min`], T[`${row.band}Last`]];
    assert.deepEqual(traces[max].y, series[`${row.band}_max`], row.band);
    assert.deepEqual(traces[min].y, series[`${row.band}_min`], row.band);
    assert.equal(traces[last].y.at(-1), series[`${row.band}_last`][0], row.band);
    assert.equal(traces[max].yaxis, row.yaxis);
  }
  assert.deepEqual(traces[T.skipRate].y, [0.25]);
  assert.deepEqual(traces[T.trackerLast].customdata, [[11]]);
  // Every line trace's columns exist, so a live flush extends each one.
  for (const i of LINE_TRACES) {
    const c = TRACE_COLUMNS[i];
    assert.ok(Array.isArray(cols[c.x]) && Array.isArray(cols[c.y]), c.id);
    assert.ok(!c.cd || Array.isArray(cols[c.cd]), c.id);
  }
});

test("a live row is a bucket with the keys of a /steps bucket", () => {
  const fromSeries = seriesBucket(oneBucketSeries(), 0);
  const live = stepAsBucket({ step: 3, scale: 4, scale_after: 2, growth_tracker: 1, skipped: false, loss: 1, lr: 0.1 });
  const { scale_first: first, ...rest } = live;
  assert.equal(first, 4);
  assert.deepEqual(Object.keys(rest).sort(), Object.keys(fromSeries).sort());
});

test("a bucket of a service without a series draws gaps there", () => {
  const series = oneBucketSeries();
  delete series.lr_min;
  assert.equal(seriesBucket(series, 0).lr_min, null);
});

test("a panel with no value drawn is hidden and says what is not recorded", () => {
  const cols = emptyColumns();
  cols.lossMin.push(2.5, null);
  cols.lossMax.push(2.5, null);
  cols.lrMin.push(null, null);
  cols.lrMax.push(null, null);
  cols.grad_normMin.push(0.5, 0.25);
  cols.grad_normMax.push(0.5, 0.25);
  assert.deepEqual(emptyPanels(cols), ["lr"]);
  assert.deepEqual(emptyPanels(emptyColumns()), ["grad_norm", "loss", "lr"]);
  const { layout, notes } = panelNotes(["lr"]);
  assert.deepEqual(layout, { "yaxis6.visible": true, "yaxis4.visible": true, "yaxis5.visible": false });
  assert.deepEqual(notes.map((n) => n.text), ["learning rate not recorded by this run"]);
  assert.deepEqual(panelNotes(["loss"], [100, 2000]).notes.map((n) => n.text), ["no loss recorded in steps 100–2,000"]);
  assert.deepEqual(panelNotes(["grad_norm"]).notes.map((n) => n.text), ["gradient norm not recorded by this run"]);
  const all = { "yaxis6.visible": true, "yaxis4.visible": true, "yaxis5.visible": true };
  assert.deepEqual(panelNotes([]), { layout: all, notes: [] });
});

test("the gradient norm has a panel of its own, on a log axis, beside the scale", () => {
  const cols = emptyColumns();
  const series = { first_step: [1], last_step: [8], n: [8], skipped: [0], scale_min: [1024], scale_max: [1024] };
  Object.assign(series, { scale_last: [1024], grad_norm_min: [0.5], grad_norm_max: [4], grad_norm_last: [1] });
  addBucket(cols, seriesBucket(series, 0), 0, true);
  const traces = figureTraces(cols, []);
  assert.deepEqual(
    [T.grad_normMax, T.grad_normMin, T.grad_normLast].map((i) => [traces[i].yaxis, traces[i].y]),
    [
      ["y6", [4]],
      ["y6", [0.5]],
      ["y6", [1]],
    ],
  );
  const layout = figureLayout(false);
  assert.equal(layout.yaxis6.type, "log");
  assert.ok(layout.yaxis6.domain[1] < layout.yaxis.domain[0], "just under the scale");
  assert.ok(layout.yaxis6.domain[0] > layout.yaxis4.domain[1], "above the loss");
});

test("spike markers sit on the loss and gradient-norm panels", () => {
  const traces = figureTraces(emptyColumns(), []);
  const loss = traces[T.lossSpikes];
  const norm = traces[T.grad_normSpikes];
  assert.deepEqual([loss.yaxis, loss.mode, loss.name], ["y4", "markers", "loss spike"]);
  assert.deepEqual([norm.yaxis, norm.mode, norm.name], ["y6", "markers", "gradient-norm spike"]);
  assert.ok(!LINE_TRACES.includes(T.lossSpikes), "not redrawn with the buckets");
  assert.deepEqual(spikePoint({ step: 120, what: "loss", value: 12, z: 41.234 }), { x: 120, y: 12, cd: ["41.2"] });
});

test("a step skipped for a spike is a marker on the scale panel, apart from overflows", () => {
  const cols = emptyColumns();
  const row = { step: 7, scale: 1024, scale_after: 2048, growth_tracker: 0, skipped: true };
  addBucket(cols, stepAsBucket({ ...row, spike_skipped: true }), 0, true);
  addBucket(cols, stepAsBucket({ ...row, step: 8, overflow: true, scale_after: 512 }), 0, false);
  const series = { ...oneBucketSeries(), spike_skips: [3] };
  addBucket(cols, seriesBucket(series, 0), 0, false);
  const older = oneBucketSeries(); // a service from before spike skips: no markers
  addBucket(cols, seriesBucket(older, 0), 0, false);
  const trace = figureTraces(cols, [])[T.spikeSkips];
  assert.deepEqual(trace.x, [7, 18]);
  assert.deepEqual(trace.y, [2048, series.scale_last[0]]);
  assert.deepEqual(trace.customdata, [[1, 7], [3, 11]]);
  assert.equal(trace.yaxis, undefined, "the scale's axis");
  assert.ok(LINE_TRACES.includes(T.spikeSkips), "live steps extend it");
});

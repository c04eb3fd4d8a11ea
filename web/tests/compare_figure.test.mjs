// The runs page's comparison: its state in the URL, the filter, and the overlaid traces.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  MAX_COMPARED,
  PALETTE,
  choiceQuery,
  matches,
  overlayLayout,
  overlayTraces,
  parseChoice,
  plotlyText,
  rateWindow,
  scaleTicks,
  skipRates,
} from "../compare_figure.js";

test("parseChoice reads the filter and the chosen runs back from the URL", () => {
  assert.deepEqual(parseChoice("?status=finished&name=bert&compare=3,7"), {
    status: "finished",
    name: "bert",
    runs: [3, 7],
  });
  assert.deepEqual(parseChoice(""), { status: "", name: "", runs: [] });
});

test("parseChoice drops what no run can be: unknown statuses, bad ids, repeats, too many", () => {
  assert.deepEqual(parseChoice("?status=paused&compare=0,-1,x,2.5,4,4,9007199254740993"), {
    status: "",
    name: "",
    runs: [4],
  });
  const many = Array.from({ length: 20 }, (_, i) => i + 1).join(",");
  assert.equal(parseChoice(`?compare=${many}`).runs.length, MAX_COMPARED);
});

test("choiceQuery is parseChoice's inverse, and empty for no choice", () => {
  for (const state of [
    { status: "running", name: "gpt 2/fp16 & co", runs: [1, 12] },
    { status: "", name: "", runs: [5] },
    { status: "crashed", name: "", runs: [] },
  ]) {
    assert.deepEqual(parseChoice(choiceQuery(state)), state);
  }
  assert.equal(choiceQuery({ status: "", name: "", runs: [] }), "");
  assert.equal(choiceQuery({ status: "", name: "", runs: [3, 7] }), "?compare=3,7");
});

test("matches filters by status and by a part of the name, ignoring case", () => {
  const run = { id: 1, name: "BERT-large fsdp", status: "running" };
  assert.ok(matches(run, { status: "", name: "" }));
  assert.ok(matches(run, { status: "running", name: " bert " }));
  assert.ok(!matches(run, { status: "finished", name: "" }));
  assert.ok(!matches(run, { status: "", name: "gpt" }));
});

test("plotlyText shows a name as text, never as Plotly's HTML", () => {
  assert.equal(plotlyText("<img src=x onerror=alert(1)> & <b>"), "&lt;img src=x onerror=alert(1)&gt; &amp; &lt;b&gt;");
});

const SERIES = {
  first_step: [1, 5, 9],
  last_step: [4, 8, 10],
  n: [4, 4, 2],
  scale_min: [512, 256, 256],
  scale_max: [1024, 512, 512],
  scale_last: [1024, 256, 512],
  skipped: [0, 1, 2],
};

test("skipRates is the skipped share of the last window of steps at each bucket's end", () => {
  assert.deepEqual(skipRates(SERIES, 200), [0, 1 / 8, 3 / 10]);
  // A window of 4 steps holds one bucket of 4 (or the last two buckets' 6 steps at the end).
  assert.deepEqual(skipRates(SERIES, 4), [0, 1 / 4, 3 / 6]);
});

test("rateWindow is the run page's 200 steps, or the widest bucket compared", () => {
  assert.equal(rateWindow(new Map()), 200);
  const charts = new Map([
    [1, { bucketWidth: 1 }],
    [2, { bucketWidth: 5000 }],
  ]);
  assert.equal(rateWindow(charts), 5000);
});

test("overlayTraces draws each run's band, scale and skipped rate in its own colour", () => {
  const runs = [
    { id: 3, name: "a" },
    { id: 7, name: "b" },
    { id: 9, name: "not loaded" },
  ];
  const charts = new Map([
    [3, { series: SERIES }],
    [7, { series: { ...SERIES, scale_last: [1, 2, 3] } }],
  ]);
  const traces = overlayTraces(runs, charts, 200);
  assert.equal(traces.length, 8);
  const [max, band, line, rate] = traces;
  assert.deepEqual([max.y, band.y, band.fill], [SERIES.scale_max, SERIES.scale_min, "tonexty"]);
  assert.deepEqual(max.x, SERIES.first_step);
  assert.deepEqual([line.x, line.y, line.name], [SERIES.last_step, SERIES.scale_last, "a (#3)"]);
  assert.deepEqual([rate.y, rate.yaxis], [[0, 1 / 8, 3 / 10], "y2"]);
  assert.ok(traces.slice(0, 4).every((t) => t.legendgroup === "run-3" && t.line.color === PALETTE[0]));
  assert.ok(traces.slice(4).every((t) => t.legendgroup === "run-7" && t.line.color === PALETTE[1]));
  assert.equal(traces.filter((t) => t.showlegend !== false).length, 2);
  assert.deepEqual(traces[6].y, [1, 2, 3]);
});

test("the scale axis ticks at powers of two over every compared run, as the run page's", () => {
  const series = (lo, hi) => ({ series: { scale_min: [lo, hi], scale_max: [lo, hi] } });
  const charts = new Map([[1, series(2 ** 10, 2 ** 13)], [2, series(2 ** 12, 2 ** 16)]]);
  const { yaxis } = overlayLayout(false, 200, charts);
  assert.equal(yaxis.type, "log");
  assert.equal(yaxis.tickmode, "array");
  assert.deepEqual(yaxis.tickvals, [10, 11, 12, 13, 14, 15, 16].map((k) => 2 ** k));
  assert.deepEqual(yaxis.ticktext, [10, 11, 12, 13, 14, 15, 16].map((k) => `2<sup>${k}</sup>`));
  assert.deepEqual(scaleTicks(new Map()), {}); // nothing drawn: Plotly's own
});

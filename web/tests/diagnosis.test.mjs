// The overflow diagnosis panels' pure parts: the rank x parameter table, the loss verdict,
// the ranking's rows.
import assert from "node:assert/strict";
import { test } from "node:test";

import { cellText, lossVerdict, paramMatrix, rankedRows, windowText } from "../diagnosis.js";

const PARAMS = [
  { rank: 0, name: "head.bias", kind: "nan", count: 3 },
  { rank: 1, name: "fc1.weight", kind: "inf", count: 12 },
  { rank: 3, name: "head.bias", kind: "both", count: 7 },
  { rank: 1, name: "emb.weight", kind: "inf", count: 900 },
];

test("paramMatrix: the ranks with findings as columns, a row a parameter", () => {
  const { ranks, rows } = paramMatrix(PARAMS);
  assert.deepEqual(ranks, [0, 1, 3]);
  // Found on most ranks first, then by non-finite elements.
  assert.deepEqual(
    rows.map((r) => r.name),
    ["head.bias", "emb.weight", "fc1.weight"],
  );
  assert.deepEqual(rows[0].cells.get(3), { kind: "both", count: 7 });
  assert.equal(rows[0].cells.get(1), undefined);
  assert.equal(rows[0].total, 10);
  assert.deepEqual(paramMatrix([]), { ranks: [], rows: [] });
});

test("paramMatrix breaks ties by name", () => {
  const tied = [
    { rank: 0, name: "b", kind: "inf", count: 1 },
    { rank: 0, name: "a", kind: "inf", count: 1 },
  ];
  assert.deepEqual(
    paramMatrix(tied).rows.map((r) => r.name),
    ["a", "b"],
  );
});

test("cellText names the kind and the count", () => {
  assert.equal(cellText({ kind: "both", count: 1234 }), "inf + NaN · 1,234");
  assert.equal(cellText({ kind: "nan", count: 3 }), "NaN · 3");
  assert.equal(cellText(undefined), "–");
});

test("lossVerdict: forward when the loss itself was not finite", () => {
  assert.deepEqual(lossVerdict({ loss: null, loss_nonfinite_ranks: [1] }), {
    forward: true,
    text: "The loss itself was inf or NaN on rank 1: a forward overflow.",
  });
  assert.match(lossVerdict({ loss: 2.5, loss_nonfinite_ranks: [0, 2] }).text, /ranks 0, 2/);
  const backward = lossVerdict({ loss: 2.5, loss_nonfinite_ranks: [] });
  assert.equal(backward.forward, false);
  assert.match(backward.text, /finite on every rank \(2\.5\)/);
  assert.equal(lossVerdict({ loss: null, loss_nonfinite_ranks: [] }).text, "The loss was not recorded at this step.");
  // A float32 loss reads to 4 significant digits, not its 16.
  assert.match(lossVerdict({ loss: 0.6930818557739258, loss_nonfinite_ranks: [] }).text, /finite on every rank \(0\.6931\):/);
});

test("rankedRows and windowText", () => {
  const ranking = {
    overflows: 40,
    params: [{ name: "head.bias", overflows: 12, ranks: [0, 1], kinds: ["inf", "nan"], last_step: 12000 }],
  };
  assert.deepEqual(rankedRows(ranking), [
    { name: "head.bias", overflows: "12 of 40", ranks: "0, 1", kinds: "inf, NaN", last: "12,000" },
  ]);
  assert.equal(windowText(null), "the whole run");
  assert.equal(windowText([1000, 2000]), "steps 1,000–2,000");
});

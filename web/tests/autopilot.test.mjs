// What the autopilot's panel and the chart's markers say about the autopilot.
import assert from "node:assert/strict";
import { test } from "node:test";

import { decisionText } from "../autopilot.js";
import { markerLabel, noteText } from "../control.js";

test("an autopilot change on the chart says who made it and why; a person's as before", () => {
  const values = { growth_interval: 144 };
  assert.equal(
    markerLabel({ values, source: "autopilot", note: "skipped-step rate 5.00%", reason: null }),
    "growth_interval = 144 (autopilot: skipped-step rate 5.00%)",
  );
  assert.equal(markerLabel({ values, source: "api", note: null, reason: null }), "growth_interval = 144");
});

test("the history's note keeps why a change was asked for when it is rejected", () => {
  assert.equal(noteText({ note: "skipped-step rate 5.00%", reason: null }), "skipped-step rate 5.00%");
  assert.equal(
    noteText({ note: "skipped-step rate 5.00%", reason: "the run finished first" }),
    "skipped-step rate 5.00%. Rejected: the run finished first",
  );
  assert.equal(noteText({ note: null, reason: "min_scale above the scale" }), "min_scale above the scale");
  assert.equal(noteText({ note: null, reason: null }), "–");
});

test("the last decision reads as its reason, the request and the step", () => {
  assert.equal(decisionText(null), "No decision yet.");
  const text = decisionText({
    action: "raise",
    reason: "skipped-step rate 4.80% over 500 steps, above the target 1.00%: growth_interval 20 -> 144",
    values: { growth_interval: 144 },
    step: 12000,
    at: 1_700_000_000,
  });
  assert.match(text, /^Last decision: skipped-step rate 4\.80% .* -> 144\. Requested growth_interval = 144\. \(step 12,000, /);
  assert.doesNotMatch(decisionText({ reason: "cooling down", values: {}, step: 5, at: 1 }), /Requested/);
});

// The run's cards at the latest step: the polled detail moved on by the live steps.
import assert from "node:assert/strict";
import { test } from "node:test";

import { LiveFacts, forecastText, scheduleText, spikesText } from "../facts.js";

const detail = (steps, extra = {}) => ({
  name: "r",
  steps,
  scale: 1024,
  overflows: 1,
  recorded: steps,
  skipped: 1,
  skipped_rate: 1 / steps,
  ...extra,
});
const row = (step, { overflow = false, scaleAfter = 2048 } = {}) => ({
  step,
  scale: 1024,
  scale_after: scaleAfter,
  overflow,
  skipped: overflow,
});

test("live steps after the detail move its figures on to the latest step", () => {
  const facts = new LiveFacts();
  facts.setDetail(detail(10));
  facts.addStep(row(11));
  facts.addStep(row(12, { overflow: true, scaleAfter: 512 }));
  assert.deepEqual(facts.current(), {
    ...detail(10),
    steps: 12,
    scale: 512,
    overflows: 2,
    recorded: 12,
    skipped: 2,
    skipped_rate: 2 / 12,
  });
});

test("a detail that caught up takes over; steps it counts are not counted twice", () => {
  const facts = new LiveFacts();
  facts.addStep(row(9)); // before any detail
  facts.addStep(row(11, { overflow: true }));
  facts.addStep(row(12));
  facts.setDetail(detail(11, { overflows: 2, skipped: 2, skipped_rate: 2 / 11 }));
  const now = facts.current();
  assert.equal(now.steps, 12);
  assert.equal(now.overflows, 2);
  assert.equal(now.skipped_rate, 2 / 12);
  facts.setDetail(detail(12, { overflows: 2, skipped: 2, skipped_rate: 2 / 12 }));
  assert.deepEqual(facts.current(), detail(12, { overflows: 2, skipped: 2, skipped_rate: 2 / 12 }));
});

test("repeated and older steps, and an older detail, change nothing", () => {
  const facts = new LiveFacts();
  facts.setDetail(detail(10));
  facts.addStep(row(11));
  facts.addStep(row(11, { overflow: true }));
  facts.addStep(row(5, { overflow: true }));
  facts.setDetail(detail(8));
  const now = facts.current();
  assert.equal(now.steps, 11);
  assert.equal(now.overflows, 1);
  assert.equal(now.recorded, 11);
});

test("no detail yet: nothing to show", () => {
  const facts = new LiveFacts();
  facts.addStep(row(1));
  assert.equal(facts.current(), null);
});

test("the schedule's card: the drift at the latest step, held, or none registered", () => {
  const facts = new LiveFacts();
  facts.setDetail(detail(10, { schedule_drift: 2, config: { schedulers: [{ name: "LambdaLR", held: false }] } }));
  facts.addStep({ ...row(11), schedule_drift: 3 });
  assert.equal(facts.current().schedule_drift, 3);
  assert.equal(scheduleText(facts.current()), "schedule ahead of the weights by 3 steps");
  assert.equal(scheduleText({ schedule_drift: 1, config: {} }), "schedule ahead of the weights by 1 step");
  const held = { schedule_drift: 0, config: { schedulers: [{ name: "OneCycleLR", held: true }] } };
  assert.equal(scheduleText(held), "held: on the weights' steps (drift 0)");
  assert.equal(scheduleText({ schedule_drift: 0, config: { schedulers: [{ held: false }] } }), "on the weights' steps (drift 0)");
  assert.equal(scheduleText({ schedule_drift: null, config: {} }), null);
});

test("where the scale is heading, with the steps it was read from", () => {
  const forecast = { text: "halving every ~310 steps: 1.0 in ~3,700 steps at this rate", first_step: 1, last_step: 12400 };
  assert.equal(
    forecastText({ forecast }),
    "halving every ~310 steps: 1.0 in ~3,700 steps at this rate (read from steps 1–12,400)",
  );
  assert.equal(forecastText({ forecast: null }), null);
  // A live step moves the detail on: the forecast stays the polled one's.
  const facts = new LiveFacts();
  facts.setDetail({ steps: 10, recorded: 10, skipped: 0, overflows: 0, forecast });
  facts.addStep({ step: 11, overflow: false, skipped: false, scale_after: 2 });
  assert.equal(forecastText(facts.current()), forecastText({ forecast }));
});

test("spikes and the gradient norm of live steps move the cards on", () => {
  const facts = new LiveFacts();
  facts.setDetail(detail(10, { spikes: { loss: 1, grad_norm: 0 }, grad_norm: 2.5 }));
  facts.addStep({ ...row(11), loss_spike: true, grad_norm_spike: false, grad_norm: 3.25 });
  facts.addStep({ ...row(12), loss_spike: false, grad_norm_spike: true, grad_norm: 40 });
  const now = facts.current();
  assert.deepEqual(now.spikes, { loss: 2, grad_norm: 1 });
  assert.equal(now.grad_norm, 40);
  assert.equal(spikesText(now.spikes), "2 loss · 1 gradient norm");
  // The next detail counts step 11: it leaves the live tail and is not counted twice.
  facts.setDetail(detail(11, { spikes: { loss: 2, grad_norm: 0 }, grad_norm: 3.25 }));
  assert.deepEqual(facts.current().spikes, { loss: 2, grad_norm: 1 });
});

test("the spikes card says none, or nothing before the detail", () => {
  assert.equal(spikesText({ loss: 0, grad_norm: 0 }), "none");
  assert.equal(spikesText({ loss: 1200, grad_norm: 0 }), "1,200 loss");
  assert.equal(spikesText(undefined), "–");
});

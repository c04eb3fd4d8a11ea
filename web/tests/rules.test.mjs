// The form's fields, hints and checks come from the rules the service serves.
import assert from "node:assert/strict";
import { test } from "node:test";

import { controlFields, fieldLabel, ruleProblem } from "../rules.js";

const SERVED = {
  fields: [
    {
      name: "growth_interval",
      integer: true,
      purpose: "steps between growths",
      requirement: "an integer >= 3",
      rule: "growth_interval must be an integer >= 3",
      bounds: { type: "integer", minimum: 3, maximum: 9 },
    },
    {
      name: "backoff_factor",
      integer: false,
      purpose: "what an overflow does",
      requirement: "a number < 0.75 and > 0.25",
      rule: "backoff_factor must be a number < 0.75 and > 0.25",
      bounds: { type: "number", exclusiveMinimum: 0.25, exclusiveMaximum: 0.75 },
    },
  ],
};

test("labels come from the field names", () => {
  assert.equal(fieldLabel("min_scale"), "Min scale");
  assert.equal(fieldLabel("growth_interval"), "Growth interval");
});

test("fields and hints are the served ones, in their order", () => {
  const fields = controlFields(SERVED);
  assert.deepEqual(fields.map((f) => [f.name, f.label, f.integer]), [
    ["growth_interval", "Growth interval", true],
    ["backoff_factor", "Backoff factor", false],
  ]);
  assert.equal(fields[0].hint, "Steps between growths: an integer >= 3");
  assert.equal(fields[1].hint, "What an overflow does: a number < 0.75 and > 0.25");
});

test("checks keep the served bounds, inclusive and exclusive, with the served message", () => {
  const [interval, backoff] = controlFields(SERVED);
  assert.equal(ruleProblem(interval, 3), null);
  assert.equal(ruleProblem(interval, 9), null);
  assert.equal(ruleProblem(interval, 2), "growth_interval must be an integer >= 3");
  assert.equal(ruleProblem(interval, 10), "growth_interval must be an integer >= 3");
  assert.equal(ruleProblem(backoff, 0.5), null);
  assert.equal(ruleProblem(backoff, 0.25), SERVED.fields[1].rule);
  assert.equal(ruleProblem(backoff, 0.75), SERVED.fields[1].rule);
});

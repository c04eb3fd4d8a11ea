// What the run page shows of its alerts: the banner's lines and the chart's bands.
import assert from "node:assert/strict";
import { test } from "node:test";

import { paths } from "../api.js";
import { alertMarks, firingLine } from "../alerts.js";

const FIRING = {
  id: 2, rule: "hot", kind: "rank_hotspot", state: "firing", fired_step: 12000, resolved_step: null,
  value: 0.75, threshold: 0.6, detail: "last 8 overflows on rank 3", text: "scalewatch: hot ...",
  says: "75% of the last 8 overflows on rank 3 (threshold 60%)",
};
const RESOLVED = { ...FIRING, id: 1, rule: "streak", kind: "skip_streak", state: "resolved",
  fired_step: 13, resolved_step: 15, value: 3, threshold: 3, detail: "",
  says: "3 skipped steps in a row (threshold 3)" };

test("a firing alert reads as its rule, since when, and its value in its kind's words", () => {
  assert.equal(firingLine(FIRING),
    "hot (rank_hotspot) since step 12,000: 75% of the last 8 overflows on rank 3 (threshold 60%)");
  assert.equal(firingLine(RESOLVED), "streak (skip_streak) since step 13: 3 skipped steps in a row (threshold 3)");
});

test("every alert is a band from where it fired to where it resolved, oldest first", () => {
  assert.deepEqual(alertMarks([FIRING, RESOLVED]), [
    { id: 1, rule: "streak", from: 13, to: 15, text: "streak (skip_streak): fired at step 13, resolved at step 15" },
    { id: 2, rule: "hot", from: 12000, to: null, text: "hot (rank_hotspot): fired at step 12,000, firing" },
  ]);
});

test("the alerts' paths", () => {
  assert.equal(paths.runAlerts("a/b"), "api/runs/a%2Fb/alerts");
  assert.equal(paths.alerts({ state: "firing", limit: 10 }), "api/alerts?state=firing&limit=10");
  assert.equal(paths.alerts(), "api/alerts");
});

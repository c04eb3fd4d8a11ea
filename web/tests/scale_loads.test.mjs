// What the run page draws of the loads of its scaler's state: a mark each, the jumps told apart.
import assert from "node:assert/strict";
import { test } from "node:test";

import { paths } from "../api.js";
import { loadMarks, loadText } from "../scale_loads.js";

const JUMP = { step: 400, from_step: 400, scale_before: 1024, scale_after: 65536, jump: true, at: 20 };
const SAME = { step: 1200, from_step: 1200, scale_before: 8, scale_after: 8, jump: false, at: 30 };
const BACK = { step: 100, from_step: 2500, scale_before: 512, scale_after: 4096, jump: true, at: 40 };

test("a jump reads as the scale before and after, at the step loaded", () => {
  assert.equal(loadText(JUMP), "scale loaded: 1,024 (2^10) → 65,536 (2^16) at step 400");
});

test("a load of the same scale says it is unchanged", () => {
  assert.equal(loadText(SAME), "scale loaded: 8 (2^3), unchanged at step 1,200");
});

test("a load of an earlier step's state says where the run was", () => {
  assert.equal(
    loadText(BACK),
    "scale loaded: 512 (2^9) → 4,096 (2^12) at step 100 (the run was at step 2,500)",
  );
});

test("the marks are the loads in the order they were made, each a jump or not", () => {
  assert.deepEqual(
    loadMarks([BACK, SAME, JUMP]).map(({ id, step, jump }) => ({ id, step, jump })),
    [
      { id: 1, step: 400, jump: true },
      { id: 2, step: 1200, jump: false },
      { id: 3, step: 100, jump: true },
    ],
  );
  assert.deepEqual(loadMarks([]), []);
});

test("the loads' path", () => {
  assert.equal(paths.scaleLoads("a/b"), "api/runs/a%2Fb/scale-loads");
});

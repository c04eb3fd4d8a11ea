// The API's paths and how a 422 body maps onto the control form's fields.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, fieldErrors, paths } from "../api.js";

test("paths are relative and escape the run id", () => {
  assert.equal(paths.run("a/b c"), "api/runs/a%2Fb%20c");
  assert.equal(paths.steps("r"), "api/runs/r/steps");
  assert.equal(paths.steps("r", { start: 0, end: 10, maxPoints: 500 }), "api/runs/r/steps?start=0&end=10&max_points=500");
  assert.equal(paths.overflows("r", null, 1000), "api/runs/r/overflows?limit=1000");
  assert.equal(paths.overflows("r", 5, 10), "api/runs/r/overflows?limit=10&after=5");
  assert.equal(paths.overflows("r", 5, 10, { params: false }), "api/runs/r/overflows?limit=10&after=5&params=false");
  assert.equal(paths.overflow("r", 12), "api/runs/r/overflows/12");
  assert.equal(paths.params("r"), "api/runs/r/params");
  assert.equal(paths.params("r", { start: 0, end: 99, limit: 10 }), "api/runs/r/params?start=0&end=99&limit=10");
  assert.equal(paths.stream("r", 0), "api/runs/r/stream?after=0");
  assert.equal(paths.stream("r"), "api/runs/r/stream");
  assert.equal(paths.exportFile("r", "steps", "csv"), "api/runs/r/export?what=steps&format=csv");
});

test("ApiError's message is the detail when it is text", () => {
  assert.equal(new ApiError(409, "run is finished").message, "run is finished");
  assert.equal(new ApiError(422, [{ msg: "x" }]).message, "HTTP 422");
});

test("fieldErrors puts FastAPI's 422 items on their fields", () => {
  const detail = [
    { loc: ["body", "growth_factor"], msg: "must be > 1" },
    { loc: ["body", "growth_factor"], msg: "must be finite" },
    { loc: ["body", "scale"], msg: "must be > 0" },
    { loc: ["body", "other"], msg: "extra field" },
    { loc: ["body"], msg: "set at least one field" },
    "plain text",
  ];
  const [byField, general] = fieldErrors(detail, ["growth_factor", "scale"]);
  assert.deepEqual(byField, { growth_factor: "must be > 1; must be finite", scale: "must be > 0" });
  assert.deepEqual(general, ["other: extra field", "set at least one field", "plain text"]);
});

test("fieldErrors of a text detail is one general message", () => {
  assert.deepEqual(fieldErrors("run is finished", ["scale"]), [{}, ["run is finished"]]);
  assert.deepEqual(fieldErrors(null, ["scale"]), [{}, []]);
});

test("fieldErrors of any other body shows it whole, on no field", () => {
  // The service sends no such body; one from elsewhere is not read as per-field messages.
  assert.deepEqual(fieldErrors({ scale: "bad" }, ["scale"]), [{}, ['{"scale":"bad"}']]);
});

test("a stream's URL gets a ticket for the kept token, never the token", async () => {
  const kept = new Map();
  globalThis.sessionStorage = { getItem: (k) => kept.get(k) ?? null, setItem: (k, v) => kept.set(k, v), removeItem: (k) => kept.delete(k) };
  const asked = [];
  globalThis.fetch = async (url, init) => {
    asked.push([url, init.headers.Authorization]);
    return { ok: true, json: async () => ({ ticket: "123.viewer.dmVyYQ.sig+/", expires_in: 60 }) };
  };
  const { storeToken, withTicket } = await import("../api.js");
  assert.equal(await withTicket("api/runs/1/stream?after=3"), "api/runs/1/stream?after=3");
  assert.deepEqual(asked, []); // no token kept: the URL as it is
  storeToken("sw_0123456789abcdef_secret");
  const url = await withTicket("api/runs/1/stream?after=3");
  assert.equal(url, "api/runs/1/stream?after=3&ticket=123.viewer.dmVyYQ.sig%2B%2F");
  assert.ok(!url.includes("secret"));
  assert.deepEqual(asked, [["api/tickets", "Bearer sw_0123456789abcdef_secret"]]);
  delete globalThis.sessionStorage;
  delete globalThis.fetch;
});

test("a Retry-After in seconds is read; a date or none is not", async () => {
  const { retryAfterSeconds } = await import("../api.js");
  assert.equal(retryAfterSeconds("1"), 1);
  assert.equal(retryAfterSeconds(" 30 "), 30);
  assert.equal(retryAfterSeconds("Wed, 21 Oct 2026 07:28:00 GMT"), null);
  assert.equal(retryAfterSeconds(null), null);
});

test("only the service's busy answer is retried coarser", async () => {
  const { isBusy } = await import("../api.js");
  assert.equal(isBusy(new ApiError(503, "busy: no chart query could start within 1 s", 1)), true);
  assert.equal(isBusy(new ApiError(503, "the store cannot be used: gone", 10)), false);
  assert.equal(isBusy(new ApiError(503, "busy: no chart query", null)), false);
  assert.equal(isBusy(new ApiError(500, "busy", 1)), false);
});

// The pages' element ids: each is also a global of the page (window[id]), seen by every
// classic script the page loads before its own, plotly.min.js among them.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";

const WEB = new URL("../", import.meta.url);
// What a UMD bundle tests with `typeof` to find a module system: an element with one of
// these ids makes plotly.js 2.x (plotly 5.x) hand itself to that element, not to window.
const MODULE_GLOBALS = ["exports", "module", "define", "require", "Plotly"];

function pageIds() {
  const ids = [];
  for (const name of readdirSync(WEB).filter((file) => file.endsWith(".html"))) {
    const html = readFileSync(new URL(name, WEB), "utf8");
    for (const match of html.matchAll(/\sid="([^"]*)"/g)) ids.push([name, match[1]]);
  }
  return ids;
}

test("the pages have ids to check", () => {
  assert.ok(pageIds().some(([name, id]) => name === "run.html" && id === "chart"));
});

test("no element id shadows a global that a UMD bundle looks for", () => {
  const shadowing = pageIds().filter(([, id]) => MODULE_GLOBALS.includes(id));
  assert.deepEqual(shadowing, []);
});

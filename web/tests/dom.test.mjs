// The display formatters: every number and time the pages show goes through these.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  displayName,
  formatAgo,
  formatCount,
  formatDuration,
  formatNumber,
  formatRate,
  formatScale,
  formatSignificant,
  formatTime,
  formatValue,
  formatValues,
} from "../dom.js";

test("formatNumber groups thousands and keeps every digit of the double", () => {
  assert.equal(formatNumber(65536), "65,536");
  assert.equal(formatNumber(65536.0390625), "65,536.0390625");
  assert.equal(formatNumber(0.5), "0.5");
  assert.equal(formatNumber(-1234567), "-1,234,567");
  assert.equal(formatNumber(1e21), "1e+21");
  assert.equal(formatNumber(Infinity), "Infinity");
  assert.equal(formatNumber(null), "off");
  assert.equal(formatNumber("x"), "x");
});

test("formatScale adds the power of two and switches to exponent form at the ends", () => {
  assert.equal(formatScale(65536), "65,536 (2^16)");
  assert.equal(formatScale(3), "3");
  assert.equal(formatScale(0.5), "0.5 (2^-1) · under 1: gradients shrunk");
  assert.equal(formatScale(2 ** 24), "1.678e+7 (2^24)");
  assert.equal(formatScale(2 ** -12), "2.441e-4 (2^-12) · under 1: gradients shrunk");
  assert.equal(formatScale(1), "1 (2^0)");
  assert.equal(formatScale(0.5, { under: " · under 1" }), "0.5 (2^-1) · under 1");
  assert.equal(formatScale(0.5, { under: "" }), "0.5 (2^-1)");
  assert.equal(formatScale(null), "–");
  assert.equal(formatScale(NaN), "–");
  assert.equal(formatScale(Infinity), "–");
});

test("formatCount and formatRate", () => {
  assert.equal(formatCount(1234), "1,234");
  assert.equal(formatCount("1234"), "1,234");
  assert.equal(formatCount(undefined), "–");
  assert.equal(formatRate(0), "0.00%");
  assert.equal(formatRate(0.25), "25.00%");
  assert.equal(formatRate(0.00005), "0.005%");
  assert.equal(formatRate(null), "–");
});

test("formatValue formats scales as scales, the rest as numbers, unset as off", () => {
  assert.equal(formatValue("scale", 1024), "1,024 (2^10)");
  assert.equal(formatValue("max_scale", 1024), "1,024 (2^10)");
  assert.equal(formatValue("growth_interval", 2000), "2,000");
  assert.equal(formatValue("scale", null), "–");
  assert.equal(formatValue("max_scale", null), "off");
  assert.equal(formatValues({ scale: 2, hysteresis: 3 }), "scale = 2 (2^1), hysteresis = 3");
  assert.equal(formatValues(null), "");
});

test("displayName shows bidirectional controls as code points", () => {
  assert.equal(displayName("\u202Etxt.exe"), "<U+202E>txt.exe");
  assert.equal(displayName("plain"), "plain");
  assert.equal(displayName(null), "");
});

test("formatTime is local YYYY-MM-DD HH:MM:SS from seconds or milliseconds", () => {
  const millis = new Date(2026, 0, 2, 3, 4, 5).getTime();
  assert.equal(formatTime(millis / 1000), "2026-01-02 03:04:05");
  assert.equal(formatTime(millis), "2026-01-02 03:04:05");
  assert.equal(formatTime(null), "–");
});

test("formatAgo counts in the largest whole unit", () => {
  const now = 1_800_000_000_000;
  const ago = (s) => formatAgo(now / 1000 - s, now);
  assert.equal(ago(0), "0 s ago");
  assert.equal(ago(59), "59 s ago");
  assert.equal(ago(60), "1 min ago");
  assert.equal(ago(7200), "2 h ago");
  assert.equal(ago(3 * 86400), "3 d ago");
  assert.equal(formatAgo(now / 1000 + 30, now), "0 s ago");
  assert.equal(formatAgo(null, now), "–");
});

test("formatDuration", () => {
  assert.equal(formatDuration(5.4), "5 s");
  assert.equal(formatDuration(65), "1 min 05 s");
  assert.equal(formatDuration(3 * 3600 + 7 * 60), "3 h 07 min");
  assert.equal(formatDuration(-3), "0 s");
  assert.equal(formatDuration(null), "–");
});

test("formatSignificant keeps at most 4 significant digits", () => {
  assert.equal(formatSignificant(0.6930818557739258), "0.6931");
  assert.equal(formatSignificant(2.5), "2.5");
  assert.equal(formatSignificant(-3.14159), "-3.142");
  assert.equal(formatSignificant(1234.5678), "1,235");
  assert.equal(formatSignificant(12345.6), "1.235e+4");
  assert.equal(formatSignificant(0.000123456), "1.235e-4");
  assert.equal(formatSignificant(0), "0");
  assert.equal(formatSignificant(Infinity), "Infinity");
  assert.equal(formatSignificant(null), "–");
});

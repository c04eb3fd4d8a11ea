// DOM building and display formatting. Data only ever reaches the page as text nodes.

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

export function setText(node, value) {
  const text = value === null || value === undefined ? "" : String(value);
  if (node.textContent !== text) node.textContent = text;
}

const STATUS_SYMBOL = {
  running: "●",
  crashed: "✕",
  finished: "✓",
  pending: "…",
  applied: "✓",
  rejected: "✕",
};

export function badge(status) {
  const known = Object.prototype.hasOwnProperty.call(STATUS_SYMBOL, status);
  const label = known ? `${STATUS_SYMBOL[status]} ${status}` : String(status);
  return el("span", { class: `badge badge-${known ? status : "other"}`, text: label });
}

// Every number the pages show goes through formatNumber (or formatScale, which adds the
// power of two): the same value reads the same on every panel and in the chart.
// A scale under 1 makes the gradients smaller, not larger (torch#99640): said where shown,
// in full where there is room (hovers, the overflow detail), in short on a card, and not at
// all in a table's column (``under: ""``), whose width every row shares.
export const UNDER_ONE = " · under 1: gradients shrunk";
export const UNDER_ONE_SHORT = " · under 1";

export function formatScale(value, { under: note = UNDER_ONE } = {}) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const exponent = Math.log2(value);
  const power = Number.isInteger(exponent) ? ` (2^${exponent})` : "";
  const under = value > 0 && value < 1 ? note : "";
  if (value >= 1e7 || value < 1e-3) return value.toExponential(3) + power + under;
  return formatNumber(value) + power + under;
}

export function formatCount(value) {
  if (value === null || value === undefined) return "–";
  return formatNumber(Number(value));
}

export function formatRate(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return `${(value * 100).toFixed(value > 0 && value < 0.001 ? 3 : 2)}%`;
}

// The shortest text that reads back as the same double (JavaScript's own), with the
// thousands grouped: 65536.0390625 is "65,536.0390625", never rounded to 6 places.
export function formatNumber(value) {
  if (value === null || value === undefined) return "off";
  if (typeof value !== "number") return String(value);
  const text = String(value);
  if (!Number.isFinite(value) || text.includes("e")) return text;
  const [whole, fraction] = text.split(".");
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return fraction === undefined ? grouped : `${grouped}.${fraction}`;
}

// A measured value (a loss) to at most ``digits`` significant digits: 0.6930818557739258 is
// "0.6931", 1234567.8 is "1.235e+6"; an integer-valued one keeps its grouping.
export function formatSignificant(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number" || !Number.isFinite(value)) return String(value);
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude >= 10 ** digits || magnitude < 1e-3)) {
    return value.toExponential(digits - 1).replace(/\.?0+e/, "e");
  }
  return formatNumber(Number(value.toPrecision(digits)));
}

const SCALE_FIELDS = new Set(["scale", "min_scale", "max_scale", "scale_after"]);

// A control or state value by its name: scales as formatScale, the rest as formatNumber.
export function formatValue(name, value) {
  if (value === null || value === undefined) return name === "scale" ? "–" : "off";
  return SCALE_FIELDS.has(name) ? formatScale(value) : formatNumber(value);
}

// Bidirectional controls (U+202E and the like) in a name reorder the text around it: a
// run named "\u202Etxt.exe" would read "exe.txt". Shown as their code points instead.
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

export function displayName(text) {
  if (text === null || text === undefined) return "";
  return String(text).replace(
    BIDI_CONTROLS,
    (c) => `<U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}>`,
  );
}

function toMillis(seconds) {
  // The API gives Unix seconds; tolerate milliseconds too.
  return seconds > 1e11 ? seconds : seconds * 1000;
}

export function formatAgo(seconds, now = Date.now()) {
  if (seconds === null || seconds === undefined) return "–";
  const delta = Math.max(0, Math.round((now - toMillis(seconds)) / 1000));
  if (delta < 60) return `${delta} s ago`;
  if (delta < 3600) return `${Math.floor(delta / 60)} min ago`;
  if (delta < 86400) return `${Math.floor(delta / 3600)} h ago`;
  return `${Math.floor(delta / 86400)} d ago`;
}

// Every time the pages show is local "YYYY-MM-DD HH:MM:SS"; ``seconds`` may be Date.now().
export function formatTime(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const date = new Date(toMillis(seconds));
  const pad = (n) => String(n).padStart(2, "0");
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`
  );
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const total = Math.max(0, Math.round(seconds));
  const [h, m, s] = [Math.floor(total / 3600), Math.floor(total / 60) % 60, total % 60];
  if (h) return `${formatNumber(h)} h ${String(m).padStart(2, "0")} min`;
  if (m) return `${m} min ${String(s).padStart(2, "0")} s`;
  return `${s} s`;
}

export function formatValues(values) {
  return Object.entries(values || {})
    .map(([key, value]) => `${key} = ${formatValue(key, value)}`)
    .join(", ");
}

export function showAlert(node, message) {
  setText(node, message || "");
  node.hidden = !message;
}

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

export function formatScale(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const exponent = Math.log2(value);
  const power = Number.isInteger(exponent) ? ` (2^${exponent})` : "";
  if (value >= 1e7 || value < 1e-3) return value.toExponential(3) + power;
  return value.toLocaleString("en-US", { maximumFractionDigits: 6 }) + power;
}

export function formatCount(value) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US");
}

export function formatRate(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return `${(value * 100).toFixed(value > 0 && value < 0.001 ? 3 : 2)}%`;
}

export function formatNumber(value) {
  if (value === null || value === undefined) return "off";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? value.toLocaleString("en-US") : String(value);
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

export function formatTime(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const date = new Date(toMillis(seconds));
  const pad = (n) => String(n).padStart(2, "0");
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`
  );
}

export function formatValues(values) {
  return Object.entries(values || {})
    .map(([key, value]) => `${key} = ${value}`)
    .join(", ");
}

export function showAlert(node, message) {
  setText(node, message || "");
  node.hidden = !message;
}

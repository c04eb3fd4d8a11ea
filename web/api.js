// The service's HTTP API (docs/ARCHITECTURE.md). Paths are relative so the
// dashboard also works behind a reverse proxy under a prefix.

export class ApiError extends Error {
  constructor(status, detail, retryAfter = null) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
    this.retryAfter = retryAfter; // seconds, where the service said when to ask again
  }
}

// A Retry-After header's seconds (a date or nothing: null).
export function retryAfterSeconds(value) {
  return value !== null && /^[0-9]+$/.test(value.trim()) ? Number(value) : null;
}

// The service's answer when no chart query could start in time (a store that cannot be
// used is a 503 too, which is reported, not retried).
export function isBusy(error) {
  return error.status === 503 && error.retryAfter !== null && String(error.detail).startsWith("busy");
}

async function readDetail(response) {
  try {
    const body = await response.json();
    return body && "detail" in body ? body.detail : body;
  } catch {
    return response.statusText || `HTTP ${response.status}`;
  }
}

// The bearer token kept for this browser session ("" when none): sent with every request,
// so reads work where the service guards them (bound beyond loopback).
export const TOKEN_KEY = "scalewatch.token";

export function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function storeToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage disabled: the token is asked for on every change instead.
  }
}

function readHeaders() {
  const token = storedToken();
  return token ? { Accept: "application/json", Authorization: `Bearer ${token}` } : { Accept: "application/json" };
}

export async function getJSON(url, { signal } = {}) {
  const response = await fetch(url, { signal, headers: readHeaders() });
  if (!response.ok) {
    const retryAfter = retryAfterSeconds(response.headers.get("Retry-After"));
    throw new ApiError(response.status, await readDetail(response), retryAfter);
  }
  return response.json();
}

// A write with the bearer token: POST and PUT send ``body`` as JSON; DELETE sends none.
export async function sendJSON(method, url, body, token) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw new ApiError(response.status, await readDetail(response));
  return response.json();
}

export function postJSON(url, body, token) {
  return sendJSON("POST", url, body, token);
}

// Who the service takes this browser for: {name, role, source, reads_open}.
export function whoami() {
  return getJSON("api/whoami");
}

// ``url`` (a stream's or an export's) with a short-lived ticket for the kept token: an
// EventSource or a download link cannot send the token as a header, and a token in a
// URL would stay in access logs. Without a kept token, ``url`` as it is.
export async function withTicket(url) {
  const token = storedToken();
  if (!token) return url;
  const { ticket } = await postJSON("api/tickets", undefined, token);
  return `${url}${url.includes("?") ? "&" : "?"}ticket=${encodeURIComponent(ticket)}`;
}

const enc = encodeURIComponent;

export const paths = {
  runs: () => "api/runs",
  controlRules: () => "api/control/rules",
  run: (id) => `api/runs/${enc(id)}`,
  steps: (id, { start, end, maxPoints } = {}) => {
    const query = new URLSearchParams();
    if (start !== undefined && start !== null) query.set("start", String(start));
    if (end !== undefined && end !== null) query.set("end", String(end));
    if (maxPoints) query.set("max_points", String(maxPoints));
    const text = query.toString();
    return `api/runs/${enc(id)}/steps${text ? `?${text}` : ""}`;
  },
  overflows: (id, after, limit, { params = true } = {}) => {
    const query = new URLSearchParams({ limit: String(limit) });
    if (after !== null && after !== undefined) query.set("after", String(after));
    if (!params) query.set("params", "false");
    return `api/runs/${enc(id)}/overflows?${query}`;
  },
  overflow: (id, step) => `api/runs/${enc(id)}/overflows/${enc(step)}`,
  spikes: (id) => `api/runs/${enc(id)}/spikes`,
  params: (id, { start, end, limit } = {}) => {
    const query = new URLSearchParams();
    if (start !== undefined && start !== null) query.set("start", String(start));
    if (end !== undefined && end !== null) query.set("end", String(end));
    if (limit) query.set("limit", String(limit));
    const text = query.toString();
    return `api/runs/${enc(id)}/params${text ? `?${text}` : ""}`;
  },
  stream: (id, after) =>
    `api/runs/${enc(id)}/stream${after === undefined || after === null ? "" : `?after=${enc(after)}`}`,
  control: (id) => `api/runs/${enc(id)}/control`,
  autopilot: (id) => `api/runs/${enc(id)}/autopilot`,
  runAlerts: (id) => `api/runs/${enc(id)}/alerts`,
  scaleLoads: (id) => `api/runs/${enc(id)}/scale-loads`,
  alerts: ({ state, limit } = {}) => {
    const query = new URLSearchParams();
    if (state) query.set("state", state);
    if (limit) query.set("limit", String(limit));
    const text = query.toString();
    return `api/alerts${text ? `?${text}` : ""}`;
  },
  exportFile: (id, what, format) =>
    `api/runs/${enc(id)}/export?what=${enc(what)}&format=${enc(format)}`,
};

// 422 bodies: the service's are all FastAPI's list of {loc, msg} (app/errors.py);
// anything else (a proxy's page) is one general message. Returns [fieldMessages, generalMessages].
export function fieldErrors(detail, fields) {
  const byField = {};
  const general = [];
  const add = (field, message) => {
    if (fields.includes(field)) byField[field] = byField[field] ? `${byField[field]}; ${message}` : message;
    else general.push(field ? `${field}: ${message}` : message);
  };
  if (Array.isArray(detail)) {
    for (const item of detail) {
      if (item && typeof item === "object") {
        const loc = Array.isArray(item.loc) ? item.loc : [];
        const field = [...loc].reverse().find((part) => fields.includes(part));
        add(field || loc.filter((p) => p !== "body").join("."), String(item.msg ?? item.message ?? ""));
      } else {
        general.push(String(item));
      }
    }
  } else if (detail) {
    general.push(typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return [byField, general];
}

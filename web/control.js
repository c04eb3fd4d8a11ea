// The control panel: values in effect, the change form, the request history.

import { ApiError, fieldErrors, getJSON, paths, postJSON, storedToken, storeToken } from "./api.js";
import { badge, displayName, el, formatTime, formatValue, formatValues, setText, showAlert } from "./dom.js";
import { ruleProblem } from "./rules.js";

const PENDING_POLL_MS = 1000;

const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

// A value in effect as the panel shows it: as the run's header and the chart do.
const stateText = formatValue;

// A change on the chart says who made it when the autopilot did, and why.
export function markerLabel(row) {
  const values = formatValues(row.values);
  return row.source === "autopilot" ? `${values} (autopilot: ${row.note || "no reason"})` : values;
}

// The history's note: why the change was asked for, and why it was rejected, if it was.
export function noteText(row) {
  if (!row.reason) return row.note || "–";
  return row.note ? `${row.note}. Rejected: ${row.reason}` : row.reason;
}

export class ControlPanel {
  // `fields`: the service's control fields (rules.js's controlFields).
  constructor(runId, fields, { onMarkers, onError, onChange, onStatus, onToken } = {}) {
    this.runId = runId;
    this.fields = fields;
    this.onMarkers = onMarkers || (() => {});
    this.onError = onError || (() => {});
    this.onChange = onChange || (() => {});
    this.onStatus = onStatus || (() => {});
    this.onToken = onToken || (() => {}); // the kept token changed: the header asks whose it is
    this.history = new Map();
    this.state = {};
    this.pollTimer = null;
    this.form = document.getElementById("control-form");
    this.tokenBox = document.getElementById("token-box");
    this.tokenInput = document.getElementById("token");
    this.tokenError = document.getElementById("token-error");
    this.formError = document.getElementById("form-error");
    this.formNotice = document.getElementById("form-notice");
    this.submitButton = document.getElementById("control-submit");
    this.forgetButton = document.getElementById("forget-token");
    this.closedNote = document.getElementById("control-closed");
    this.fieldsBox = document.getElementById("control-fields");
    this.formHelp = document.getElementById("control-form-help");
    this.actions = this.submitButton.parentElement;
    this.open = true; // the run takes changes (known once its status is)
    this.inputs = {};
    this.errors = {};
    this.buildFields();
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.forgetButton.addEventListener("click", () => {
      storeToken("");
      this.updateTokenUi();
      this.notice("Token forgotten for this browser session.");
      this.onToken();
    });
    this.updateTokenUi();
  }

  buildFields() {
    const box = document.getElementById("control-fields");
    for (const field of this.fields) {
      const id = `f-${field.name}`;
      const input = el("input", {
        id,
        name: field.name,
        type: "text",
        inputmode: field.integer ? "numeric" : "decimal",
        autocomplete: "off",
        spellcheck: "false",
        "aria-describedby": `${id}-hint ${id}-error`,
      });
      const error = el("p", { class: "field-error", id: `${id}-error`, hidden: true });
      box.append(
        el(
          "div",
          { class: "field", dataset: { field: field.name } },
          el("label", { for: id, text: field.label }),
          input,
          el("p", { class: "field-hint", id: `${id}-hint`, text: field.hint }),
          error,
        ),
      );
      this.inputs[field.name] = input;
      this.errors[field.name] = error;
    }
  }

  // Only a running run takes changes: otherwise the form is disabled and says why.
  setRunStatus(status) {
    this.open = status === "running";
    this.status = status;
    const writable = this.open && !this.readOnly;
    for (const input of [...Object.values(this.inputs), this.tokenInput]) input.disabled = !writable;
    this.submitButton.disabled = !writable;
    this.closedNote.hidden = writable;
    const why = this.readOnly || (this.open ? "" : `This run is ${status}: it takes no changes.`);
    setText(this.closedNote, why);
    // A run that takes no more changes says so, without a form it could not send.
    for (const node of [this.fieldsBox, this.formHelp, this.actions]) node.hidden = !this.open;
    this.updateTokenUi();
    this.onStatus(status);
  }

  // The identity's role changes no run: the form stays disabled and says why.
  setReadOnly(message) {
    this.readOnly = message;
    this.setRunStatus(this.status || "running");
  }

  // The token to send a write with (the one kept, else the one typed); "" after asking
  // for it. The autopilot's switch sends its writes with it too.
  tokenToSend() {
    const token = storedToken() || this.tokenInput.value.trim();
    if (!token) {
      this.updateTokenUi("Enter the access token to send changes.");
      this.tokenInput.focus();
    }
    return token;
  }

  // A token the server refused: forgotten, and asked for again.
  refuseToken() {
    const had = Boolean(storedToken());
    storeToken("");
    this.tokenInput.value = "";
    this.updateTokenUi("The token was refused. Enter it again.");
    this.tokenInput.focus();
    if (had) this.onToken();
  }

  // A token the server accepted: kept for the browser session, the token box hidden, and
  // the header told who it names.
  keepToken(token) {
    const changed = storedToken() !== token;
    storeToken(token);
    this.tokenInput.value = "";
    this.updateTokenUi();
    if (changed) this.onToken();
  }

  updateTokenUi(message) {
    const have = Boolean(storedToken());
    // No token to ask for where no change can be sent (a finished run, a viewer).
    this.tokenBox.hidden = (have && !message) || !this.open || Boolean(this.readOnly);
    this.forgetButton.hidden = !have;
    setText(this.tokenError, message || "");
    this.tokenError.hidden = !message;
    this.tokenInput.setAttribute("aria-invalid", message ? "true" : "false");
  }

  async refresh() {
    const body = await getJSON(paths.control(this.runId));
    // The history comes in pages, the newest page first: the chart marks every applied change.
    const rows = [...(body.history || [])];
    for (let page = body; page.next !== null && page.next !== undefined; ) {
      page = await getJSON(`${paths.control(this.runId)}?before=${page.next}&limit=1000`);
      rows.push(...(page.history || []));
    }
    this.renderState(body.state || {});
    this.history = new Map(rows.map((row) => [row.id, row]));
    this.renderHistory();
  }

  // A control event from the run's stream.
  onEvent(row) {
    this.history.set(row.id, { ...(this.history.get(row.id) || {}), ...row });
    this.renderHistory();
    if (row.status === "applied") this.refresh().catch((error) => this.onError(error));
    this.onChange(row);
  }

  // A step from the run's stream: the scale in effect moves every step.
  onStep(step) {
    const shown = document.querySelector('#control-state [data-state="scale"]');
    if (!shown || step.scale_after === undefined) return; // the panel has not loaded yet
    this.state = { ...this.state, scale: step.scale_after };
    setText(shown, stateText("scale", step.scale_after));
    this.inputs.scale.placeholder = `now ${stateText("scale", step.scale_after)}`;
  }

  renderState(state) {
    this.state = state;
    const list = document.getElementById("control-state");
    const entries = this.fields.map((field) => [field.label, state[field.name], field.name]);
    list.replaceChildren(
      ...entries.flatMap(([label, value, name]) => [
        el("dt", { text: label }),
        el("dd", { dataset: { state: name }, text: stateText(name, value) }),
      ]),
    );
    setText(
      document.getElementById("control-version"),
      state.version !== undefined ? `Control version ${state.version}` : "",
    );
    for (const field of this.fields) {
      const value = state[field.name];
      this.inputs[field.name].placeholder = value === null || value === undefined ? "off" : `now ${stateText(field.name, value)}`;
    }
  }

  renderHistory() {
    const rows = [...this.history.values()].sort((a, b) => b.id - a.id);
    const tbody = document.querySelector("#history tbody");
    tbody.replaceChildren(
      ...rows.map((row) =>
        el(
          "tr",
          { dataset: { requestId: row.id, status: row.status } },
          el("td", { class: "num", "data-label": "#", text: row.id }),
          el("td", { "data-label": "Requested", text: formatTime(row.requested_at) }),
          el("td", { "data-label": "Change", text: formatValues(row.values) }),
          el("td", { "data-label": "By", text: displayName([row.requested_by, row.source].filter(Boolean).join(" · ")) }),
          el("td", { "data-label": "Status" }, badge(row.status)),
          el("td", {
            class: "num",
            "data-label": "Applied at step",
            dataset: { cell: "applied-step" },
            text: row.applied_step ?? "–",
          }),
          el("td", { "data-label": "Note", text: noteText(row) }),
        ),
      ),
    );
    document.getElementById("history").dataset.count = String(rows.length);
    document.getElementById("history-empty").hidden = rows.length > 0;
    this.onMarkers(
      rows
        .filter((row) => row.status === "applied" && row.applied_step !== null && row.applied_step !== undefined)
        .sort((a, b) => a.id - b.id)
        .map((row) => ({ id: row.id, step: row.applied_step, label: markerLabel(row) })),
    );
    clearTimeout(this.pollTimer);
    if (rows.some((row) => row.status === "pending")) {
      this.pollTimer = setTimeout(() => this.refresh().catch((error) => this.onError(error)), PENDING_POLL_MS);
    }
  }

  clearMessages() {
    for (const field of this.fields) this.fieldError(field.name, "");
    showAlert(this.formError, "");
    showAlert(this.formNotice, "");
  }

  fieldError(name, message) {
    setText(this.errors[name], message);
    this.errors[name].hidden = !message;
    this.inputs[name].setAttribute("aria-invalid", message ? "true" : "false");
  }

  notice(message) {
    showAlert(this.formError, "");
    showAlert(this.formNotice, message);
  }

  readValues() {
    const values = {};
    const bad = {};
    for (const field of this.fields) {
      const raw = this.inputs[field.name].value.trim();
      if (!raw) continue;
      // Plain decimal notation only: Number() would also take "0x10" or "0b11".
      const number = DECIMAL.test(raw) ? Number(raw) : NaN;
      if (!Number.isFinite(number)) bad[field.name] = "Enter a finite number.";
      else if (field.integer && !Number.isInteger(number)) bad[field.name] = "Enter a whole number.";
      else if (ruleProblem(field, number)) bad[field.name] = ruleProblem(field, number);
      else values[field.name] = number;
    }
    return [values, bad];
  }

  async submit() {
    if (!this.open) return; // a script, or a status that changed under the form
    this.clearMessages();
    const [values, bad] = this.readValues();
    if (Object.keys(bad).length) {
      this.showFieldErrors(bad);
      return;
    }
    if (!Object.keys(values).length) {
      showAlert(this.formError, "Fill in at least one field to change.");
      return;
    }
    const token = this.tokenToSend();
    if (!token) return;
    this.submitButton.disabled = true;
    try {
      const row = await postJSON(paths.control(this.runId), values, token);
      this.keepToken(token);
      for (const name of Object.keys(values)) this.inputs[name].value = "";
      this.notice(`Request #${row.id} sent (${formatValues(row.values || values)}); it applies at the run's next step.`);
      this.history.set(row.id, row);
      this.renderHistory();
    } catch (error) {
      if (error instanceof ApiError && error.status !== 401 && error.status !== 403) {
        this.keepToken(token); // any other answer came after the token was checked
      }
      this.showRefusal(error);
    } finally {
      this.submitButton.disabled = !this.open;
    }
  }

  showRefusal(error) {
    if (!(error instanceof ApiError)) {
      showAlert(this.formError, `Could not reach the server: ${error.message}`);
      return;
    }
    if (error.status === 401 || error.status === 403) {
      this.refuseToken();
    } else if (error.status === 409) {
      showAlert(this.formError, "This run is not running, so it cannot take changes.");
    } else if (error.status === 404) {
      showAlert(this.formError, "This run does not exist (any more).");
    } else if (error.status === 422) {
      const [byField, general] = fieldErrors(error.detail, this.fields.map((field) => field.name));
      this.showFieldErrors(byField);
      if (general.length) showAlert(this.formError, `Refused: ${general.join("; ")}`);
      else if (!Object.keys(byField).length) showAlert(this.formError, "The server refused these values.");
    } else {
      const message = typeof error.detail === "string" ? error.detail : error.message;
      showAlert(this.formError, `The server refused the change (HTTP ${error.status}): ${message}`);
    }
  }

  showFieldErrors(byField) {
    let first = null;
    for (const [name, message] of Object.entries(byField)) {
      this.fieldError(name, message);
      first = first || this.inputs[name];
    }
    if (first) first.focus();
  }
}

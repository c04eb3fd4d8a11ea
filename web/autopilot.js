// The autopilot's part of the control panel: its state, its last decision, its switch.

import { ApiError, getJSON, paths, sendJSON } from "./api.js";
import { formatNumber, formatRate, formatTime, formatValues, setText, showAlert } from "./dom.js";

const POLL_MS = 3000;
const DECIMAL = /^(\d+\.?\d*|\.\d+)$/;

const STATE_TEXT = {
  off: "Off",
  watching: "On: watching the skipped-step rate",
  gave_up: "Stopped itself: its changes did not help",
  ended: "Ended with the run: it changes nothing more",
};

// The decision as one line: what it did (or why not), at which step.
export function decisionText(decision) {
  if (!decision) return "No decision yet.";
  const change = decision.values && Object.keys(decision.values).length ? ` Requested ${formatValues(decision.values)}.` : "";
  const step = decision.step !== undefined && decision.step !== null ? ` (step ${formatNumber(decision.step)}, ${formatTime(decision.at)})` : "";
  return `Last decision: ${decision.reason}.${change}${step}`;
}

export class AutopilotPanel {
  // ``tokens``: the control panel, whose token box and token this panel shares.
  constructor(runId, tokens, { onError } = {}) {
    this.runId = runId;
    this.tokens = tokens;
    this.onError = onError || (() => {});
    this.open = true;
    this.view = null;
    this.timer = null;
    this.node = document.getElementById("autopilot");
    this.switch = document.getElementById("autopilot-switch");
    this.target = document.getElementById("autopilot-target");
    this.stateNode = document.getElementById("autopilot-state");
    this.decisionNode = document.getElementById("autopilot-decision");
    this.reasonNode = document.getElementById("autopilot-reason");
    this.error = document.getElementById("autopilot-error");
    this.switch.addEventListener("click", () => this.toggle());
  }

  // The identity's role changes no run: the switch stays off whatever the run's status.
  setReadOnly() {
    this.readOnly = true;
    this.switch.disabled = true;
    this.target.disabled = true;
  }

  setRunStatus(status) {
    const was = this.open;
    this.open = status === "running";
    this.switch.disabled = !this.open || Boolean(this.readOnly);
    this.target.disabled = !this.open || Boolean(this.readOnly);
    // A run that ended (or resumed) changes the state shown; polling stops while ended.
    if (was !== this.open && this.view) this.refresh().catch((e) => this.onError(e));
  }

  async refresh() {
    clearTimeout(this.timer);
    try {
      this.render(await getJSON(paths.autopilot(this.runId)));
    } finally {
      if (this.open) this.timer = setTimeout(() => this.refresh().catch((e) => this.onError(e)), POLL_MS);
    }
  }

  render(view) {
    this.view = view;
    const on = Boolean(view.enabled);
    this.node.dataset.state = view.state;
    // Ended: the run is over, though the run's status may not have been polled yet.
    const closed = !this.open || view.state === "ended" || Boolean(this.readOnly);
    this.switch.disabled = closed;
    this.target.disabled = closed;
    this.switch.setAttribute("aria-checked", on ? "true" : "false");
    setText(this.switch, on ? "Turn off" : "Turn on");
    setText(this.stateNode, STATE_TEXT[view.state] || view.state);
    if (view.target_skip_rate !== null && view.target_skip_rate !== undefined && document.activeElement !== this.target) {
      this.target.value = formatNumber(view.target_skip_rate * 100);
    }
    setText(
      document.getElementById("autopilot-settings"),
      on
        ? `Target ${formatRate(view.target_skip_rate)}; growth_interval ${formatNumber(view.min_growth_interval)}–${formatNumber(view.max_growth_interval)}; ${formatNumber(view.cooldown_steps)} steps between changes, ${formatNumber(view.max_changes_per_hour)} an hour at most.`
        : "",
    );
    setText(this.decisionNode, on || view.decision ? decisionText(view.decision) : "");
    const again = this.open ? " Turn it on again to start over." : "";
    showAlert(this.reasonNode, view.state === "gave_up" ? `Why: ${view.reason}.${again}` : "");
  }

  readTarget() {
    const raw = this.target.value.trim();
    const percent = DECIMAL.test(raw) ? Number(raw) : NaN;
    return percent > 0 && percent < 100 ? percent / 100 : null;
  }

  async toggle() {
    if (!this.open) return;
    showAlert(this.error, "");
    const on = Boolean(this.view && this.view.enabled);
    const rate = on ? null : this.readTarget();
    if (!on && rate === null) {
      showAlert(this.error, "Enter a target: the percent of steps it may skip, more than none and fewer than all (1 for 1%).");
      this.target.focus();
      return;
    }
    const token = this.tokens.tokenToSend();
    if (!token) return;
    this.switch.disabled = true;
    try {
      const body = on ? undefined : { ...this.keptBounds(), enabled: true, target_skip_rate: rate };
      const view = await sendJSON(on ? "DELETE" : "PUT", paths.autopilot(this.runId), body, token);
      this.tokens.keepToken(token);
      this.render(view);
    } catch (error) {
      this.showRefusal(error, token);
    } finally {
      this.switch.disabled = !this.open || Boolean(this.readOnly);
    }
  }

  // Turned on again, it keeps the bounds it had (set through the API).
  keptBounds() {
    const view = this.view || {};
    const kept = {};
    for (const name of ["min_growth_interval", "max_growth_interval", "min_scale", "cooldown_steps", "max_changes_per_hour"]) {
      if (view[name] !== null && view[name] !== undefined) kept[name] = view[name];
    }
    return kept;
  }

  showRefusal(error, token) {
    if (!(error instanceof ApiError)) {
      showAlert(this.error, `Could not reach the server: ${error.message}`);
    } else if (error.status === 401 || error.status === 403) {
      this.tokens.refuseToken();
    } else {
      this.tokens.keepToken(token);
      const detail = Array.isArray(error.detail)
        ? error.detail.map((item) => (item && item.msg) || String(item)).join("; ")
        : String(error.detail || error.message);
      showAlert(this.error, `Refused (HTTP ${error.status}): ${detail}`);
    }
  }
}

// A run's alerts: the banner of those firing, and every alert as a band on the chart.

import { getJSON, paths } from "./api.js";
import { el, formatNumber, setText } from "./dom.js";

const POLL_MS = 2000;

// One line for the banner: "streak (skip_streak) since step 13: 12 skipped steps in a row
// (threshold 10)", the value in its kind's words as the service says it.
export function firingLine(alert) {
  return `${alert.rule} (${alert.kind}) since step ${formatNumber(alert.fired_step)}: ${alert.says}`;
}

// The chart's hover text: no run name (Plotly reads its text as markup).
function markText(a) {
  const end = a.resolved_step === null || a.resolved_step === undefined
    ? "firing"
    : `resolved at step ${formatNumber(a.resolved_step)}`;
  return `${a.rule} (${a.kind}): fired at step ${formatNumber(a.fired_step)}, ${end}`;
}

// What the chart draws of each alert: from the step it fired to the one it resolved.
export function alertMarks(alerts) {
  return [...alerts]
    .sort((a, b) => a.id - b.id)
    .map((a) => ({ id: a.id, rule: a.rule, from: a.fired_step, to: a.resolved_step, text: markText(a) }));
}

export class AlertsView {
  constructor(runId, { onMarks, onError } = {}) {
    this.runId = runId;
    this.onMarks = onMarks || (() => {});
    this.onError = onError || (() => {});
    this.banner = document.getElementById("alerts-banner");
    this.list = document.getElementById("alerts-firing");
    this.title = document.getElementById("alerts-title");
  }

  async poll() {
    try {
      const body = await getJSON(paths.runAlerts(this.runId));
      this.render(body.alerts || []);
    } catch (error) {
      this.onError(new Error(`Could not load the run's alerts: ${error.message}`));
    }
    setTimeout(() => this.poll(), POLL_MS);
  }

  render(alerts) {
    const firing = alerts.filter((a) => a.state === "firing").sort((a, b) => a.id - b.id);
    this.list.replaceChildren(
      ...firing.map((a) => el("li", { dataset: { rule: a.rule, alertId: a.id }, text: firingLine(a) })),
    );
    setText(this.title, firing.length === 1 ? "1 alert firing" : `${firing.length} alerts firing`);
    this.banner.dataset.count = String(firing.length);
    this.banner.hidden = firing.length === 0;
    this.onMarks(alertMarks(alerts));
  }
}

// The run's figures as of the latest step the page has. The detail is polled every 2 s
// while steps stream in as they are written, so the detail is moved on by the live steps
// after it: the cards then say what the chart and the control panel say, at one step.

export class LiveFacts {
  constructor() {
    this.detail = null; // the last /api/runs/{id} body
    this.after = []; // live step rows after the detail's last step, oldest first
    this.overflows = 0; // of the rows in ``after``
    this.skipped = 0;
    this.spikes = { loss: 0, grad_norm: 0 };
  }

  count(row, by) {
    if (row.overflow) this.overflows += by;
    if (row.skipped) this.skipped += by;
    if (row.loss_spike) this.spikes.loss += by;
    if (row.grad_norm_spike) this.spikes.grad_norm += by;
  }

  // A polled detail: the steps it already counts leave the live tail.
  setDetail(run) {
    if (this.detail && run.steps < this.detail.steps) return; // an older answer, overtaken
    this.detail = run;
    this.after = this.after.filter((row) => row.step > run.steps);
    this.overflows = 0;
    this.skipped = 0;
    this.spikes = { loss: 0, grad_norm: 0 };
    for (const row of this.after) this.count(row, 1);
  }

  // A live step row; one already counted (the detail's, or a repeat after a reconnect) is dropped.
  addStep(row) {
    const last = this.after.length ? this.after[this.after.length - 1].step : this.detail ? this.detail.steps : -Infinity;
    if (!(row.step > last)) return;
    this.after.push(row);
    this.count(row, 1);
  }

  // The detail's fields, with steps, scale, overflows, skipped_rate, spikes and the gradient
  // norm at the latest step.
  current() {
    const run = this.detail;
    if (!run || !this.after.length) return run;
    const latest = this.after[this.after.length - 1];
    const recorded = run.recorded + this.after.length;
    const skipped = run.skipped + this.skipped;
    const drift = latest.schedule_drift;
    const spikes = run.spikes && {
      loss: run.spikes.loss + this.spikes.loss,
      grad_norm: run.spikes.grad_norm + this.spikes.grad_norm,
    };
    return {
      ...run,
      ...(drift === null || drift === undefined ? {} : { schedule_drift: drift }),
      ...(spikes ? { spikes } : {}),
      ...("grad_norm" in latest ? { grad_norm: latest.grad_norm } : {}),
      steps: latest.step,
      scale: Number(latest.scale_after),
      overflows: run.overflows + this.overflows,
      recorded,
      skipped,
      skipped_rate: recorded ? skipped / recorded : 0,
    };
  }
}

// The spikes card: "2 loss · 1 gradient norm", "none", or "–" before the detail says.
export function spikesText(spikes) {
  if (!spikes) return "–";
  const parts = [];
  if (spikes.loss) parts.push(`${spikes.loss.toLocaleString("en-US")} loss`);
  if (spikes.grad_norm) parts.push(`${spikes.grad_norm.toLocaleString("en-US")} gradient norm`);
  return parts.length ? parts.join(" · ") : "none";
}

// The LR schedule's card: null when the run registers no scheduler (the card is hidden).
// run.config.schedulers: [{name, held}], as the scaler's watch_schedulers/hold set them.
export function scheduleText(run) {
  const schedulers = (run.config && run.config.schedulers) || [];
  const drift = run.schedule_drift;
  if (!schedulers.length && (drift === null || drift === undefined)) return null;
  const held = schedulers.length > 0 && schedulers.every((s) => s.held);
  if (drift) {
    const steps = drift === 1 ? "1 step" : `${drift.toLocaleString("en-US")} steps`;
    return `schedule ahead of the weights by ${steps}`;
  }
  return held ? "held: on the weights' steps (drift 0)" : "on the weights' steps (drift 0)";
}

// Where the scale is heading (the detail's forecast), with the steps it was read from:
// null when the run has too few steps (the card is hidden).
export function forecastText(run) {
  const f = run.forecast;
  if (!f) return null;
  const range = `${f.first_step.toLocaleString("en-US")}–${f.last_step.toLocaleString("en-US")}`;
  return `${f.text} (read from steps ${range})`;
}

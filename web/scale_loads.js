// A run's loads of its scaler's state (load_state_dict, load_checkpoint) once it had
// steps: a mark on the scale panel for each, strong where the scale jumped.

import { getJSON, paths } from "./api.js";
import { formatNumber, formatScale } from "./dom.js";

// The hover text of one load: "scale loaded: 1,024 (2^10) → 65,536 (2^16) at step 400",
// and, for a load of an earlier step's state, the step the run was at. Plain text: Plotly
// reads a hover text as markup, and this one holds no run name.
export function loadText(load) {
  const back = load.from_step !== load.step ? ` (the run was at step ${formatNumber(load.from_step)})` : "";
  const scales = load.jump
    ? `${formatScale(load.scale_before)} → ${formatScale(load.scale_after)}`
    : `${formatScale(load.scale_after)}, unchanged`;
  return `scale loaded: ${scales} at step ${formatNumber(load.step)}${back}`;
}

// What the chart draws of each load, oldest first: { id, step, jump, text }.
export function loadMarks(items) {
  return [...items]
    .sort((a, b) => a.at - b.at || a.step - b.step)
    .map((load, i) => ({ id: i + 1, step: load.step, jump: Boolean(load.jump), text: loadText(load) }));
}

// Reads the run's loads and hands their marks to ``onMarks``; ``refresh()`` again when
// the run's count of loads changes (its detail, polled, says so).
export class ScaleLoadsView {
  constructor(runId, { onMarks, onError } = {}) {
    this.runId = runId;
    this.onMarks = onMarks || (() => {});
    this.onError = onError || (() => {});
    this.seen = null; // the count of loads last read
  }

  async refresh() {
    try {
      const body = await getJSON(paths.scaleLoads(this.runId));
      const items = body.items || [];
      this.seen = items.length;
      this.onMarks(loadMarks(items));
    } catch (error) {
      this.onError(new Error(`Could not load the run's scale loads: ${error.message}`));
    }
  }

  // The run's detail as polled: a new load since the last read is read now.
  onDetail(run) {
    if (this.seen !== null && run && Number.isInteger(run.scale_loads) && run.scale_loads !== this.seen) {
      this.refresh();
    }
  }
}

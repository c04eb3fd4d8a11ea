// The runs page's comparison: the chosen runs listed, and one chart of their scale curves
// and skipped-step rates overlaid by step, each run's buckets from its chart query.

import { getJSON, paths } from "./api.js";
import { displayName, el, setText } from "./dom.js";
import { COMPARE_POINTS, PALETTE, overlayLayout, overlayTraces, rateWindow } from "./compare_figure.js";

// A running run's chart is asked for again at most this often.
const LIVE_REFRESH_MS = 10_000;

export class Comparison {
  constructor(section, { onRemove, onClear }) {
    this.section = section;
    this.list = section.querySelector("#compare-list");
    this.note = section.querySelector("#compare-note");
    this.node = section.querySelector("#compare-chart");
    this.onRemove = onRemove;
    section.querySelector("#compare-clear").addEventListener("click", onClear);
    this.charts = new Map(); // run id -> {at, series}
    this.drawn = "";
    this.busy = false;
    this.refused = "";
    this.missing = [];
    this.next = null;
  }

  // Say why a run was not added; said until the choice next changes.
  refuse(text) {
    this.refused = text;
    this.showNote();
  }

  showNote() {
    const missing = this.missing.length ? `Not drawn: ${this.missing.join("; ")}` : "";
    setText(this.note, [this.refused, missing].filter(Boolean).join(" "));
  }

  // Show ``ids`` (in the order chosen); ``known`` maps run ids to the runs listed.
  async show(ids, known, { changed = false } = {}) {
    if (changed) this.refused = "";
    this.section.hidden = ids.length === 0;
    const runs = ids.map((id) => known.get(id) || { id, name: `run ${id}`, status: "unknown" });
    this.renderList(runs);
    if (!ids.length || typeof window.Plotly === "undefined") return;
    if (this.busy) {
      this.next = [ids, known]; // drawn as soon as the charts in flight are
      return;
    }
    this.busy = true;
    try {
      const now = Date.now();
      const stale = runs.filter((run) => {
        const have = this.charts.get(run.id);
        return !have || (run.status === "running" && now - have.at > LIVE_REFRESH_MS);
      });
      const missing = [];
      await Promise.all(
        stale.map(async (run) => {
          try {
            const body = await getJSON(paths.steps(run.id, { maxPoints: COMPARE_POINTS }));
            this.charts.set(run.id, { at: Date.now(), series: body.series, bucketWidth: body.bucket_width });
          } catch (error) {
            missing.push(`${displayName(run.name)}: ${error.message}`);
          }
        }),
      );
      if (stale.length) this.missing = missing;
      this.showNote();
      const key = runs.map((run) => `${run.id}@${this.charts.get(run.id)?.at}`).join(",");
      if (key !== this.drawn) await this.draw(runs, key);
    } finally {
      this.busy = false;
    }
    if (this.next) {
      const [nextIds, nextKnown] = this.next;
      this.next = null;
      await this.show(nextIds, nextKnown);
    }
  }

  renderList(runs) {
    const items = runs.map((run, i) => {
      const name = displayName(run.name);
      return el(
        "li",
        { dataset: { runId: run.id } },
        el("span", { class: "swatch", style: `background:${PALETTE[i % PALETTE.length]}`, "aria-hidden": "true" }),
        el("span", { text: `${name} (#${run.id})` }),
        el("button", {
          type: "button",
          class: "secondary",
          text: "×",
          "aria-label": `Remove ${name} from the comparison`,
          onclick: () => this.onRemove(run.id),
        }),
      );
    });
    this.list.replaceChildren(...items);
  }

  async draw(runs, key) {
    const shown = runs.map((run) => ({ ...run, name: displayName(run.name) }));
    const drawnCharts = new Map(runs.filter((run) => this.charts.has(run.id)).map((run) => [run.id, this.charts.get(run.id)]));
    const steps = rateWindow(drawnCharts);
    const traces = overlayTraces(shown, drawnCharts, steps);
    const narrow = window.matchMedia("(max-width: 640px)").matches;
    this.node.dataset.rateWindow = String(steps);
    await window.Plotly.react(this.node, traces, overlayLayout(narrow, steps, drawnCharts), {
      responsive: true,
      displaylogo: false,
    });
    this.drawn = key;
    const drawn = runs.filter((run) => this.charts.has(run.id));
    this.node.dataset.runs = drawn.map((run) => run.id).join(",");
    this.node.dataset.points = String(drawn.reduce((sum, run) => sum + this.charts.get(run.id).series.n.length, 0));
  }
}

// Overflow diagnosis on the run page: one overflow's parameters (rank x parameter),
// whether its loss was already non-finite, and the parameters that overflow most in
// the chart's visible window. The pure functions at the top are tested in web/tests/.

import { getJSON, paths } from "./api.js";
import { displayName, el, formatCount, formatScale, formatSignificant, setText } from "./dom.js";

const KIND_TEXT = { inf: "inf", nan: "NaN", both: "inf + NaN" };
export const RANKED_PARAMS = 10;

// The findings of one overflow as a table: the ranks that had any (columns) and one row a
// parameter, the one found on most ranks first, then by non-finite elements, then name.
export function paramMatrix(params) {
  const ranks = [...new Set(params.map((p) => p.rank))].sort((a, b) => a - b);
  const rows = new Map();
  for (const p of params) {
    if (!rows.has(p.name)) rows.set(p.name, { name: p.name, cells: new Map(), total: 0 });
    const row = rows.get(p.name);
    row.cells.set(p.rank, { kind: p.kind, count: p.count });
    row.total += p.count;
  }
  const ordered = [...rows.values()].sort(
    (a, b) => b.cells.size - a.cells.size || b.total - a.total || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0),
  );
  return { ranks, rows: ordered };
}

export function cellText(cell) {
  return cell ? `${KIND_TEXT[cell.kind] || cell.kind} · ${formatCount(cell.count)}` : "–";
}

// Was it the loss? A forward overflow (the loss itself inf/NaN) or a backward one.
export function lossVerdict(item) {
  const ranks = item.loss_nonfinite_ranks || [];
  if (ranks.length) {
    const which = `rank${ranks.length > 1 ? "s" : ""} ${ranks.join(", ")}`;
    return { forward: true, text: `The loss itself was inf or NaN on ${which}: a forward overflow.` };
  }
  if (item.loss === null || item.loss === undefined) {
    return { forward: false, text: "The loss was not recorded at this step." };
  }
  return {
    forward: false,
    text: `The loss was finite on every rank (${formatSignificant(item.loss)}): the gradients overflowed in backward.`,
  };
}

// The window the ranking covers: the chart's view, or the whole run.
export function windowText(view) {
  return view ? `steps ${formatCount(view[0])}–${formatCount(view[1])}` : "the whole run";
}

export function rankedRows(ranking) {
  return (ranking.params || []).map((p) => ({
    name: p.name,
    overflows: `${formatCount(p.overflows)} of ${formatCount(ranking.overflows)}`,
    ranks: p.ranks.join(", "),
    kinds: p.kinds.map((k) => KIND_TEXT[k] || k).join(", "),
    last: formatCount(p.last_step),
  }));
}

// The detail of the overflow last clicked, in #overflow-detail.
export class OverflowDetail {
  constructor(runId, node) {
    this.runId = runId;
    this.node = node;
    this.loading = null;
  }

  async show(step) {
    if (this.loading) this.loading.abort();
    const controller = new AbortController();
    this.loading = controller;
    this.node.dataset.step = String(step);
    this.node.dataset.state = "loading";
    try {
      const item = await getJSON(paths.overflow(this.runId, step), { signal: controller.signal });
      if (!controller.signal.aborted) this.render(item);
    } catch (error) {
      if (error.name === "AbortError") return;
      this.node.replaceChildren(el("p", { class: "alert", role: "alert", text: error.message }));
      this.node.dataset.state = "error";
    } finally {
      if (this.loading === controller) this.loading = null;
    }
  }

  render(item) {
    const verdict = lossVerdict(item);
    const { ranks, rows } = paramMatrix(item.params || []);
    const head = el(
      "tr",
      {},
      el("th", { scope: "col", text: "Parameter" }),
      ...ranks.map((rank) => el("th", { scope: "col", class: "num", text: `rank ${rank}` })),
    );
    const body = rows.map((row) =>
      el(
        "tr",
        { dataset: { param: row.name } },
        el("th", { scope: "row", class: "param-name", text: displayName(row.name) }),
        ...ranks.map((rank) => {
          const cell = row.cells.get(rank);
          return el("td", {
            class: "num",
            "data-label": `rank ${rank}`,
            dataset: cell ? { kind: cell.kind, rank: String(rank) } : { rank: String(rank) },
            text: cellText(cell),
          });
        }),
      ),
    );
    const omitted = item.params_omitted
      ? el("p", { class: "muted small", text: `${formatCount(item.params_omitted)} more parameters were non-finite but not kept (32 a rank at most).` })
      : null;
    const none = rows.length
      ? null
      : el("p", { class: "muted small", text: "No parameter was named at this step (see the documentation on fused optimizers)." });
    // replaceChildren writes a null as the text "null": only the parts there are.
    const parts = [
      el("h3", { text: `Overflow at step ${formatCount(item.step)}` }),
      el("p", {
        class: "small",
        text: `Scale ${formatScale(item.scale)} → ${formatScale(item.scale_after)}; inf/NaN gradients on rank${item.inf_ranks.length === 1 ? "" : "s"} ${item.inf_ranks.join(", ") || "–"}.`,
      }),
      el("p", { class: verdict.forward ? "loss-flag forward" : "loss-flag", dataset: { lossFlag: verdict.forward ? "forward" : "backward" }, text: verdict.text }),
      rows.length
        ? el(
            "div",
            { class: "table-wrap" },
            el(
              "table",
              { class: "param-matrix", dataset: { count: String(rows.length) } },
              el("caption", { class: "visually-hidden", text: "Non-finite gradient elements by parameter and rank" }),
              el("thead", {}, head),
              el("tbody", {}, ...body),
            ),
          )
        : none,
      omitted,
    ].filter((part) => part !== null);
    this.node.replaceChildren(...parts);
    this.node.dataset.state = "shown";
  }
}

// "Parameters that overflow most" over the chart's visible window, in #params-panel.
export class ParamsPanel {
  constructor(runId, node) {
    this.runId = runId;
    this.node = node;
    this.view = null;
    this.loading = null;
  }

  async refresh(view = this.view) {
    this.view = view;
    if (this.loading) this.loading.abort();
    const controller = new AbortController();
    this.loading = controller;
    const query = { start: view ? view[0] : undefined, end: view ? view[1] : undefined, limit: RANKED_PARAMS };
    try {
      const ranking = await getJSON(paths.params(this.runId, query), { signal: controller.signal });
      if (!controller.signal.aborted) this.render(ranking, view);
    } catch (error) {
      if (error.name !== "AbortError") throw error;
    } finally {
      if (this.loading === controller) this.loading = null;
    }
  }

  render(ranking, view) {
    setText(this.node.querySelector("[data-window]"), windowText(view));
    const rows = rankedRows(ranking).map((row) =>
      el(
        "tr",
        { dataset: { param: row.name } },
        el("td", { class: "param-name", "data-label": "Parameter", text: displayName(row.name) }),
        el("td", { class: "num", "data-label": "Overflows", text: row.overflows }),
        el("td", { "data-label": "Ranks", text: row.ranks }),
        el("td", { "data-label": "Kinds", text: row.kinds }),
        el("td", { class: "num", "data-label": "Last step", text: row.last }),
      ),
    );
    this.node.querySelector("tbody").replaceChildren(...rows);
    this.node.querySelector("table").dataset.count = String(rows.length);
    this.node.querySelector("[data-empty]").hidden = rows.length > 0;
    this.node.dataset.view = view ? view.join("-") : "all";
  }
}

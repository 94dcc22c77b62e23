// The job page's evaluations: an Evaluate button per disk checkpoint (held-out loss and
// perplexity per source; a task file goes through the API or `ringside checkpoints evaluate`),
// a table of every evaluation of the job's checkpoints, and each source's held-out loss
// against the checkpoint's step. An evaluation's progress and state are pushed over the job's
// socket (`pushed`); its results are read once it has ended.
import { api } from "./api.js";
import { CONFIG } from "./chartkit.js";
import { el, errorText } from "./format.js";

const UNDER_WAY = new Set(["pending", "running"]);

const fixed = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : "–");

function taskScores(results) {
  return Object.entries(results?.tasks ?? {}).map(([name, t]) =>
    `${name}: ${fixed(t.exact_match ?? t.accuracy, 2)}`).join(", ");
}

export class Evaluations {
  constructor(jobId, card) {
    this.jobId = jobId;
    this.card = card;
    this.table = card.querySelector("tbody");
    this.chart = card.querySelector(".chart");
    this.byCheckpoint = new Map(); // checkpoint id -> its evaluations, oldest first
  }

  url(checkpoint) {
    return `/api/jobs/${this.jobId}/checkpoints/${checkpoint.id}/evaluate/`;
  }

  button(checkpoint) {
    return el("button", { class: "evaluate", onclick: () => this.start(checkpoint) }, "Evaluate");
  }

  // the disk checkpoints as the export list shows them: their evaluations, read once
  async show(checkpoints) {
    const fresh = checkpoints.filter((c) => !this.byCheckpoint.has(c.id));
    for (const c of fresh) this.byCheckpoint.set(c.id, []);
    await Promise.all(fresh.map((c) => this.follow(c)));
  }

  async start(checkpoint) {
    const { ok, status, data } = await api(this.url(checkpoint), { method: "POST", body: {} });
    const record = ok ? data : { id: `refused-${Date.now()}`, step: checkpoint.step, state: "refused",
                                 error: errorText(data, status) };
    if (!this.byCheckpoint.has(checkpoint.id)) this.byCheckpoint.set(checkpoint.id, []);
    this.byCheckpoint.get(checkpoint.id).push(record);
    this.render();
  }

  async follow(checkpoint) {
    const { ok, data } = await api(this.url(checkpoint));
    if (!ok) return;
    const refused = (this.byCheckpoint.get(checkpoint.id) ?? []).filter((e) => e.state === "refused");
    this.byCheckpoint.set(checkpoint.id, [...data.results, ...refused]);
    this.render();
  }

  // an `evaluation` message: its state and items scored; the results once it has ended
  pushed(evaluation) {
    const listed = this.byCheckpoint.get(evaluation.checkpoint) ?? [];
    const known = listed.find((e) => e.id === evaluation.id);
    if (known) Object.assign(known, evaluation);
    else listed.push({ ...evaluation });
    this.byCheckpoint.set(evaluation.checkpoint, listed);
    // an evaluation that ended is shown with its results, read once
    if (UNDER_WAY.has(evaluation.state)) this.render();
    else this.follow({ id: evaluation.checkpoint });
  }

  all() {
    return [...this.byCheckpoint.values()].flat().sort((a, b) => a.step - b.step);
  }

  render() {
    const all = this.all();
    this.card.hidden = !all.length;
    this.table.replaceChildren(...all.map((e) => this.row(e)));
    this.plot(all.filter((e) => e.state === "done"));
  }

  row(e) {
    const heldout = Object.entries(e.results?.heldout ?? {}).map(([source, h]) =>
      `${source}: ${fixed(h.loss)} (ppl ${fixed(h.perplexity, 2)})`).join(", ");
    const progress = e.items_total ? ` ${e.items_done}/${e.items_total}` : "";
    return el("tr", { dataset: { evaluationId: e.id, state: e.state } },
      el("td", { class: "num" }, `step ${e.step}`),
      el("td", {}, `${e.state}${progress}`),
      el("td", {}, e.state === "done" ? heldout : e.error ?? ""),
      el("td", {}, taskScores(e.results)));
  }

  plot(done) {
    const sources = new Map(); // source -> [[step, loss]]
    for (const e of done) {
      for (const [source, h] of Object.entries(e.results?.heldout ?? {})) {
        if (!sources.has(source)) sources.set(source, []);
        sources.get(source).push([e.step, h.loss]);
      }
    }
    const traces = [...sources].map(([source, points]) => ({
      type: "scatter", mode: "lines+markers", name: source,
      x: points.map(([s]) => s), y: points.map(([, loss]) => loss),
    }));
    Plotly.react(this.chart, traces, {
      height: 220, title: { text: "Held-out loss by checkpoint", font: { size: 14 } },
      margin: { l: 48, r: 16, t: 36, b: 40 }, xaxis: { title: { text: "step" } },
      yaxis: { title: { text: "nats/token" } },
    }, CONFIG);
  }
}

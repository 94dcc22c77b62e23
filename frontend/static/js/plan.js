// The PaRO planner's table (GET /api/plan/): predicted memory per device, step time and
// tokens/s for every strategy on one model, batch and layout, and where the compute time came
// from (a measured job, the host's calibrated rate, or nothing yet). On one node, strategies
// that run the same are one row naming all of them. Used by the launch form and the reshard
// control.
import { api } from "./api.js";
import { bytes, el, errorText } from "./format.js";

const PARAMS = ["preset", "model", "nodes", "procs_per_node", "hosts", "micro_batch", "seq_len",
                "grad_accum", "collective", "memory_budget_gb"];

// a step takes from milliseconds to minutes: two significant decimals either way
function stepTime(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  return seconds < 1 ? `${(seconds * 1000).toFixed(0)} ms` : `${seconds.toFixed(2)} s`;
}

function tokensPerS(rate) {
  return rate === null || rate === undefined ? "–" : `${Math.round(rate).toLocaleString("en")}/s`;
}

// "measured: job 12" and "calibrated ..." price the compute; "unknown: why" leaves it out
function sourceText(source) {
  return source?.startsWith("unknown: ")
    ? `Step time unknown: ${source.slice("unknown: ".length)}.`
    : `Step time = compute (${source}) + predicted communication.`;
}

export class PlanTable {
  // `onPick(strategy)` runs when a row is chosen; `selected()` names the chosen strategy;
  // `onLoad(answer)`, if given, runs with each answer of the planner.
  constructor(container, { onPick, selected, onLoad }) {
    this.container = container;
    this.onPick = onPick;
    this.onLoad = onLoad;
    this.selected = selected;
    this.request = 0;
    this.timer = null;
  }

  // Debounced: typing in a field asks once, after the typing stops.
  update(params) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.load(params), 250);
  }

  async load(params) {
    const query = new URLSearchParams();
    for (const key of PARAMS) {
      if (params[key] !== undefined && params[key] !== "") query.set(key, params[key]);
    }
    const request = ++this.request;
    this.container.dataset.state = "loading";
    const { ok, status, data } = await api(`/api/plan/?${query}`);
    if (request !== this.request) return; // a newer request is on its way
    if (!ok) {
      this.container.replaceChildren(el("p", { class: "error" }, `Planner: ${errorText(data, status)}`));
      this.container.dataset.state = "error";
      return;
    }
    this.plans = data.plans;
    this.render(data);
    this.onLoad?.(data);
    this.container.dataset.state = "ready";
  }

  render({ memory_budget_bytes: budget, plans }) {
    const chosen = this.selected();
    const body = plans.map((p) => el("tr", {
      class: [p.fits ? "fits" : "no-fit", p.names.includes(chosen) ? "chosen" : ""].join(" "),
      dataset: { strategy: p.strategy, names: p.names.join(" ") },
      onclick: () => { this.onPick(p.strategy); this.mark(p.strategy); },
    },
    el("td", {}, el("input", { type: "radio", value: p.strategy, // no name: not a form field; mark() keeps one checked
                               checked: p.names.includes(chosen), "aria-label": p.names.join(" = ") })),
    el("td", {}, el("strong", {}, p.names.join(" = "))),
    el("td", { class: "num" }, bytes(p.memory_bytes.params)),
    el("td", { class: "num" }, bytes(p.memory_bytes.grads)),
    el("td", { class: "num" }, bytes(p.memory_bytes.optim)),
    el("td", { class: "num" }, bytes(p.memory_bytes.total)),
    el("td", { class: "num" }, stepTime(p.step_time_s)),
    el("td", { class: "num" }, tokensPerS(p.tokens_per_s)),
    el("td", {}, p.fits ? "fits" : "too big")));
    this.container.replaceChildren(el("table", { class: "plan" },
      el("caption", {}, `Per device; budget ${bytes(budget)}. Fastest that fits first. `,
         el("span", { class: "compute-source" }, sourceText(plans[0]?.compute_source)), " ",
         el("span", { class: "link-source" }, `Links ${plans[0]?.link_source ?? ""}.`)),
      el("thead", {}, el("tr", {}, ["", "strategy", "params", "grads", "optimizer", "total",
                                    "step time", "tokens/s", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, body)));
  }

  mark(strategy) {
    for (const row of this.container.querySelectorAll("tr[data-strategy]")) {
      const on = row.dataset.names.split(" ").includes(strategy);
      row.classList.toggle("chosen", on);
      row.querySelector("input").checked = on;
    }
  }

  prediction(strategy) {
    return this.plans?.find((p) => p.names.includes(strategy));
  }
}

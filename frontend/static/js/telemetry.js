// Per-op timing and expert load on the job page, from `ops` and `experts` events: the per-op
// time breakdown per step, a rank x op heatmap (each cell: that rank's time over the median
// rank's, so a straggler is a red row), bus bandwidth per collective group, and the
// expert-load heatmap (layer x expert, any kept step).

import { CONFIG, colorOf, waitingLayout } from "./chartkit.js";
import { OTHER, stackOf } from "./opstack.js";
import { Throttled } from "./throttle.js";

const KEEP = 300; // steps of ops/experts kept in the page; older ones live on the server
const RANK_WINDOW = 10; // steps averaged in the rank heatmap, so one noisy step does not flicker
const STRAGGLER_RATIO = 1.3; // a rank this much slower than the median on own compute is named
// These four charts redraw at most once a second. Redrawn with every step, they kept the page
// busy long enough to hold back the loss chart: bench/step_to_browser.py on a 2-core machine
// measured p50 115-175 / p99 357-408 ms that way, and 81-82 / 176-225 ms throttled.
const REDRAW_EVERY_MS = 1000;
const TITLES = {
  ops: "Time per step by op (mean over ranks, ms)",
  ranks: "Rank × op: time over the median rank",
  bandwidth: "Collective bus bandwidth per group (GB/s, bytes-weighted)",
  experts: "Expert load (layer × expert)",
};
const FIXED_COLORS = { [OTHER]: "#d1d5db", data: "#9ca3af" };

function median(values) {
  const sorted = values.filter((v) => v !== undefined).sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

function layout(title, extra = {}) {
  return { title: { text: title, font: { size: 14 } }, margin: { l: 90, r: 16, t: 36, b: 40 },
           height: 280, uirevision: "keep", ...extra };
}

// Top-level ops (no dot in the name) and every collective: the rows a person reads first.
function headline(ops) {
  return Object.keys(ops).filter((name) => !name.includes(".") || ops[name].kind === "collective");
}

// The group a collective's bytes crossed on the step's layout (intra: the ranks of a node,
// inter: one rank of each node, global: all of them), or null for a group of one rank. On
// one node the global group is the intra one, on one rank per node the inter one: one line.
function groupOn(group, { nodes = 1, procs_per_node: procs = 1 }) {
  const size = { intra: procs, inter: nodes, global: nodes * procs }[group];
  if (!size || size < 2) return null;
  if (group === "global" && nodes === 1) return "intra";
  if (group === "global" && procs === 1) return "inter";
  return group;
}

// Kept events, one per step, in step order; a step trained again replaces its entry.
class StepBuffer {
  constructor() { this.items = []; }
  put(event) {
    const i = this.items.findIndex((e) => e.step >= event.step);
    if (i === -1) this.items.push(event);
    else if (this.items[i].step === event.step) this.items[i] = event;
    else this.items.splice(i, 0, event);
    if (this.items.length > KEEP) this.items.shift();
  }
  get last() { return this.items.at(-1); }
  dropAfter(step) { this.items = this.items.filter((e) => e.step <= step); }
}

export class Telemetry {
  // `layoutAt(step)`: the parallel layout ({nodes, procs_per_node}) the step ran on.
  constructor({ layoutAt }) {
    this.layoutAt = layoutAt;
    this.ops = new StepBuffer();
    this.experts = new StepBuffer();
    const draw = { breakdown: () => this.drawBreakdown(), ranks: () => this.drawRanks(),
                   bandwidth: () => this.drawBandwidth(), experts: () => this.drawExperts() };
    this.redraw = new Throttled(REDRAW_EVERY_MS, (chart) => draw[chart]());
    this.slider = document.getElementById("experts-step");
    this.slider.addEventListener("input", () => this.drawExperts());
    this.placeholders();
  }

  // What the charts show before their data; `text` once the run is known to have none.
  placeholders(text) {
    for (const [chart, title] of Object.entries(TITLES)) {
      Plotly.react(`chart-${chart}`, [], waitingLayout(title, 280, text), CONFIG);
    }
  }

  // One event, or the snapshot's kept steps (oldest first).
  addOps(events) {
    for (const event of [events].flat()) this.ops.put(event);
    for (const chart of ["breakdown", "ranks", "bandwidth"]) this.redraw.mark(chart);
  }

  addExperts(events) {
    for (const event of [events].flat()) this.experts.put(event);
    this.redraw.mark("experts");
  }

  // A rollback to `step`: the steps past it are no longer the run's (they are trained again).
  rollback(step) {
    this.ops.dropAfter(step);
    this.experts.dropAfter(step);
    if (!this.ops.items.length && !this.experts.items.length) this.placeholders();
    for (const chart of ["breakdown", "ranks", "bandwidth", "experts"]) this.redraw.mark(chart);
  }

  // Stacked bars of each step's non-overlapping ops (opstack.js): they add up to the step.
  drawBreakdown() {
    const events = this.ops.items;
    if (!events.length) return;
    const stacks = events.map(stackOf);
    const names = [...new Set(stacks.flatMap(Object.keys))].sort()
      .sort((a, b) => (a === OTHER) - (b === OTHER)); // what no op names goes on top
    const steps = events.map((e) => e.step);
    const traces = names.map((name) => ({
      type: "bar", name, x: steps, y: stacks.map((s) => s[name] ?? 0),
      marker: { color: FIXED_COLORS[name] ?? colorOf(name) },
      hovertemplate: `${name}: %{y:.2f} ms<extra>step %{x}</extra>`,
    }));
    Plotly.react("chart-ops", traces, layout(TITLES.ops,
      { barmode: "stack", bargap: 0.05, xaxis: { title: { text: "step" } }, legend: { font: { size: 10 } } }), CONFIG);
  }

  drawRanks() {
    const recent = this.ops.items.slice(-RANK_WINDOW);
    const last = recent.at(-1);
    if (!last) return;
    const ops = headline(last.ops).filter((n) => last.ops[n].per_rank_ms?.length);
    const ranks = last.ranks?.length ?? last.ops[ops[0]]?.per_rank_ms.length ?? 0;
    // a rank's own compute: its step less its time in collectives and data. Compute ops that
    // enclose collectives (forward_backward around the gradient reduce-scatter) also hold the
    // time fast ranks spend waiting for a slow one, so only this column tells who is slow
    // (the engine's straggler detector reads the same number).
    const OWN = "own compute";
    const cell = (e, name, rank) => (name === OWN
      ? [e.ranks?.[rank]?.compute_ms, median((e.ranks ?? []).map((r) => r.compute_ms))]
      : [e.ops[name]?.per_rank_ms?.[rank], e.ops[name]?.median_ms]);
    const columns = last.ranks?.length ? [OWN, ...ops] : ops;
    // mean over the window of (rank's time / median rank's time), per column
    const ratio = (name, rank) => {
      const values = recent.map((e) => cell(e, name, rank))
        .filter(([t, m]) => t !== undefined && m > 0).map(([t, m]) => t / m);
      return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
    };
    const z = [], text = [];
    for (let r = 0; r < ranks; r += 1) {
      z.push(columns.map((name) => ratio(name, r)));
      text.push(columns.map((name) => `${(cell(last, name, r)[0] ?? 0).toFixed(2)} ms`));
    }
    let straggler = null, worst = STRAGGLER_RATIO;
    if (columns[0] === OWN) {
      z.forEach((row, r) => { if ((row[0] ?? 0) > worst) { worst = row[0]; straggler = r; } });
    }
    const labels = [...Array(ranks).keys()].map((r) => (r === straggler ? `rank ${r} ⚠ straggler` : `rank ${r}`));
    const chart = document.getElementById("chart-ranks");
    chart.dataset.straggler = straggler ?? "";
    Plotly.react(chart, [{
      type: "heatmap", z, x: columns, y: labels, text, zmin: 0.5, zmax: 2.5,
      colorscale: [[0, "#dbeafe"], [0.25, "#ffffff"], [0.5, "#fecaca"], [1, "#b91c1c"]],
      colorbar: { title: { text: "× median" }, thickness: 12 },
      hovertemplate: "%{y}, %{x}<br>%{text} (%{z:.2f}× the median rank)<extra></extra>",
    }], layout(`${TITLES.ranks} (last ${recent.length} steps)`,
      { height: Math.max(260, 170 + 28 * ranks), yaxis: { autorange: "reversed" },
        margin: { l: 130, r: 16, t: 36, b: 130 }, xaxis: { tickangle: -60, dtick: 1 } }), CONFIG);
  }

  // A line per process group of the layout (groupOn), bytes-weighted over its collectives.
  drawBandwidth() {
    const byGroup = {};
    for (const e of this.ops.items) {
      const sums = {};
      const layout = this.layoutAt(e.step);
      for (const o of Object.values(e.ops)) {
        const group = o.kind === "collective" && o.bytes ? groupOn(o.group, layout) : null;
        if (!group) continue;
        const s = (sums[group] ??= { bytes: 0, weighted: 0 });
        s.bytes += o.bytes;
        s.weighted += o.bytes * (o.busbw_gbps ?? 0);
      }
      for (const [group, s] of Object.entries(sums)) {
        const t = (byGroup[group] ??= { x: [], y: [] });
        t.x.push(e.step);
        t.y.push(s.weighted / s.bytes);
      }
    }
    if (!Object.keys(byGroup).length) return;
    const traces = Object.entries(byGroup).sort().map(([group, t]) => ({
      type: "scatter", mode: "lines+markers", marker: { size: 4, color: colorOf(group) },
      line: { color: colorOf(group) }, name: group, ...t,
      hovertemplate: `${group}: %{y:.3f} GB/s<extra>step %{x}</extra>`,
    }));
    Plotly.react("chart-bandwidth", traces, layout(TITLES.bandwidth,
      { xaxis: { title: { text: "step" } }, margin: { l: 60, r: 16, t: 36, b: 40 } }), CONFIG);
  }

  drawExperts() {
    const items = this.experts.items;
    if (!items.length) return;
    const max = items.length - 1;
    const following = this.slider.max === "" || Number(this.slider.value) >= Number(this.slider.max);
    this.slider.max = max;
    if (following) this.slider.value = max; // stay on the newest step unless scrubbing back
    const event = items[Number(this.slider.value)];
    const layers = event.layers ?? [];
    // load relative to a perfectly balanced router: 1 = its fair share of tokens
    const z = layers.map((l) => {
      const t = l.tokens_per_expert ?? [];
      const mean = t.reduce((a, b) => a + b, 0) / (t.length || 1);
      return t.map((v) => (mean ? v / mean : 0));
    });
    const worst = Math.max(0, ...layers.map((l) => l.max_violation ?? 0));
    const dead = layers.reduce((sum, l) => sum + (l.dead_experts ?? 0), 0);
    document.getElementById("experts-label").textContent =
      `step ${event.step} · max violation ${worst.toFixed(2)} · dead experts ${dead}`;
    Plotly.react("chart-experts", [{
      type: "heatmap", z, y: layers.map((_, i) => `MoE layer ${i}`), zmin: 0, zmax: 3,
      colorscale: "YlOrRd", colorbar: { title: { text: "× fair share" }, thickness: 12 },
      hovertemplate: "%{y}, expert %{x}: %{z:.2f}× its fair share<extra></extra>",
    }], layout(TITLES.experts, { xaxis: { title: { text: "expert" } },
      height: Math.max(200, 90 + 30 * layers.length), yaxis: { autorange: "reversed" } }), CONFIG);
  }
}

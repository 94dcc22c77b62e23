// Each data-parallel rank's share of the step's global batch (samples per step), a step line
// per rank beside the rank heatmap. The engine announces every change as a `rebalance` action
// (by the fault policy following the ranks' speeds, or for a person's command), in force from
// the step after the event's. The shares are part of the checkpointed train state, so
// whatever resumes from a checkpoint (a rollback, a restart, a change of hosts) goes back to
// the shares in force when that checkpoint was written, and on another number of ranks (a
// reshard, a change of hosts) shares that no longer fit give way to even ones, as the engine's
// loader does. The chart is a function of the page's events in sequence order, so a reloaded
// page draws what a live one drew.
import { CONFIG, rankColor, waitingLayout } from "./chartkit.js";
import { Throttled } from "./throttle.js";
import { SpecDefaults } from "./vocabulary.js";

const TITLE = "Shares of the batch (samples per step)";
const HEIGHT = 280;
const REDRAW_EVERY_MS = 1000; // as often as the rank heatmap beside it (telemetry.js)

const { train: TRAIN, parallel: PARALLEL } = SpecDefaults;
export const worldOf = (parallel = {}) =>
  (parallel.nodes ?? PARALLEL.nodes) * (parallel.procs_per_node ?? PARALLEL.procs_per_node);

// Samples per step of the whole job (micro_batch x ranks x grad_accum): a reshard or a change
// of hosts keeps it, changing the per-rank micro-batch or accumulation instead, so the spec
// of any layout gives it.
function globalBatch(spec) {
  const t = spec.train ?? {};
  return (t.micro_batch ?? TRAIN.micro_batch) * worldOf(spec.parallel) *
    (t.grad_accum ?? TRAIN.grad_accum);
}

// The live branch's shares, [{step, seq, shares}] in step order: `shares[r]` is rank r's
// samples per step from `step` on; `seq` the event that set them. `events`: the page's
// {actions, memberships, checkpoints}.
function sharesHistory(spec, { actions, memberships, checkpoints }) {
  const batch = globalBatch(spec);
  const even = (world) => Array(world).fill(batch / world);
  // the page's spec has the job's layout now (after any reshard); the first checkpoint was
  // written on the first layout
  let world = checkpoints[0]?.world_size ?? worldOf(spec.parallel);
  const history = [{ step: 1, seq: -1, shares: even(world) }];
  const change = (step, seq, shares) => {
    while (history.length && history.at(-1).step >= step) history.pop(); // a later word on it
    history.push({ step, seq, shares });
  };
  // Resume from `checkpoint` ({step, seq} of its event; step 0: none, from the start): the
  // changes made after it was written are gone. `by`: the event that resumed.
  const resume = ({ step, seq }, by) => {
    while (history.length > 1 && (history.at(-1).seq > seq || history.at(-1).step > step + 1)) {
      history.pop();
    }
    if (history.at(-1).shares.length !== world) change(step + 1, by.seq, even(world));
  };
  const written = new Map(); // step -> its newest checkpoint event
  let newest = { step: 0, seq: -1 }; // the checkpoint a restart resumes from
  const events = [...actions, ...memberships, ...checkpoints].sort((a, b) => a.seq - b.seq);
  for (const e of events) {
    if (e.type === "checkpoint") {
      written.set(e.step, e);
      newest = e;
    } else if (e.type === "membership") {
      world = e.world_size;
      resume(newest, e);
    } else if (e.action === "rebalance" && Array.isArray(e.shares)) {
      change(e.step + 1, e.seq, e.shares);
    } else if (e.action === "rollback" && Number.isInteger(e.to_step)) {
      // the checkpoints past its target are forgotten: a restart resumes from the target
      // (one older than the page's events goes by its step alone)
      newest = written.get(e.to_step) ?? { step: e.to_step, seq: Infinity };
      resume(newest, e);
    } else if (e.action === "restart") {
      resume(newest, e);
    } else if (e.action === "reshard" && e.parallel) {
      world = worldOf(e.parallel);
      if (history.at(-1).shares.length !== world) change(e.step + 1, e.seq, even(world));
    }
  }
  return history;
}

// Rank r's line through `points`: its samples at each, held up to the point where the rank
// is gone (fewer ranks), then a gap.
function rankLine(points, r) {
  const x = [], y = [];
  points.forEach((p, i) => {
    const before = points[i - 1]?.shares[r];
    if (p.shares[r] === undefined && before !== undefined) { x.push(p.step); y.push(before); }
    x.push(p.step);
    y.push(p.shares[r] ?? null);
  });
  return { x, y };
}

export class SharesChart {
  // `events()`: the page's {actions, memberships, checkpoints}; `newestStep()`: the newest
  // step the page has seen, where the lines end.
  constructor({ spec, events, newestStep }) {
    this.spec = spec;
    this.events = events;
    this.newestStep = newestStep;
    this.div = document.getElementById("chart-shares");
    this.redraw = new Throttled(REDRAW_EVERY_MS, () => this.draw());
    Plotly.react(this.div, [], waitingLayout(TITLE, HEIGHT), CONFIG);
  }

  // A step or an event that may move the shares: redrawn within a second.
  update() {
    this.redraw.mark("shares");
  }

  // The shares the ranks train with now (the Rebalance panel starts from them).
  current() {
    return sharesHistory(this.spec, this.events()).at(-1).shares;
  }

  draw() {
    const newest = this.newestStep();
    if (!newest) return; // still waiting for the first step
    const history = sharesHistory(this.spec, this.events());
    const last = history.at(-1);
    const points = last.step < newest ? [...history, { ...last, step: newest }] : history;
    const ranks = Math.max(...history.map((h) => h.shares.length));
    const traces = [...Array(ranks).keys()].map((r) => ({
      type: "scatter", mode: "lines+markers", name: `rank ${r}`, ...rankLine(points, r),
      line: { shape: "hv", color: rankColor(r), width: 1.6 }, marker: { size: 4, color: rankColor(r) },
      hovertemplate: `rank ${r} · step %{x}: %{y} samples<extra></extra>`,
    }));
    Plotly.react(this.div, traces, {
      title: { text: TITLE, font: { size: 14 } }, height: HEIGHT, uirevision: "keep",
      margin: { l: 50, r: 16, t: 36, b: 40 }, legend: { font: { size: 10 } },
      xaxis: { title: { text: "step" } }, yaxis: { title: { text: "samples" }, rangemode: "tozero" },
    }, CONFIG);
  }
}

// The step-metric charts of the job page: loss (with the server's min/max envelope, eval loss
// and markers for anomalies, actions and checkpoints), tokens/s, grad norm, learning rate,
// memory and the system metrics of each rank (CPU %, RSS; GPU memory and utilisation). Live
// step events extend the traces (the loss chart at most ten times a second, the others at
// most once a second); a zoom on any of them refetches the window from the metrics
// endpoint, so a 100,000-step run is drawn from a few thousand downsampled points and a
// one-step spike still shows in the envelope.
import { api } from "./api.js";
import { CONFIG, colorOf, rankColor, waitingLayout } from "./chartkit.js";
import { X_TITLES, bindPrefs, ema } from "./chartprefs.js";
import { bytes, num } from "./format.js";
import { Throttled } from "./throttle.js";

const MAX_POINTS = 1500; // per series, asked of the server; about one per pixel on a wide screen
const REFETCH_AT = 2 * MAX_POINTS; // live points appended past this: ask for a downsampled copy
// The loss chart takes live steps at most ten times a second (a fast job's steps, drawn in
// every animation frame, kept the main thread busy); the others at most once a second, so
// that drawing them does not hold back the loss chart's next step.
const LOSS_REDRAW_MS = 100;
const SECONDARY_REDRAW_MS = 1000;
const MARKERS = {
  anomalies: { color: "#dc2626", symbol: "x", size: 11 },
  actions: { color: "#d97706", symbol: "triangle-up", size: 10 },
  checkpoints: { color: "#059669", symbol: "diamond", size: 9 },
  memberships: { color: "#475569", symbol: "square", size: 10 },
};

const MARKER_LABEL = {
  anomalies: (e) => `anomaly ${e.kind}`,
  actions: (e) => `action ${e.action}`,
  checkpoints: () => "checkpoint",
  memberships: (e) => `hosts ${e.hosts_before.join(", ")} → ${e.hosts_after.join(", ")}`,
};

// One chart per entry; `names` are the stored series it draws (the first is the main one).
export const CHARTS = {
  loss: { title: "Loss", names: ["loss", "eval_loss"], color: "#2563eb", markers: true, height: 360 },
  tokens_per_s: { title: "Throughput (tokens/s)", names: ["tokens_per_s"], color: "#059669" },
  grad_norm: { title: "Gradient norm", names: ["grad_norm"], color: "#7c3aed" },
  lr: { title: "Learning rate", names: ["lr"], color: "#0891b2" },
  memory: { title: "Memory (largest rank)", names: [], prefix: "memory.", color: "#9333ea", bytes: true },
  system: { title: "System (per rank)", names: [], prefix: "system.", perRank: true, height: 360 },
  // drawn only for a job that trains on sources (train.data.mix); its card is hidden otherwise
  sources: { title: "Per source: loss and share of tokens seen", names: [], height: 400,
             prefix: ["source_loss.", "eval_source_loss.", "source_tokens."], perSource: true },
};
const prefixesOf = (chart) => [chart.prefix ?? []].flat();
const PREFIXES = Object.values(CHARTS).flatMap(prefixesOf);
// the series the x-axis options are computed from (chartprefs.js), fetched with the charts'
const AXIS_NAMES = ["tokens", "step_time"];
// The system chart's two rows (CPU above, memory below); a rank keeps its colour in both, the
// GPU's series are drawn dotted or dashed beside its CPU's.
const SYSTEM_ROWS = [
  { axis: "y", fields: { cpu_percent: "solid", gpu_util_percent: "dot" } },
  { axis: "y2", fields: { rss_bytes: "solid", gpu_memory_bytes: "dash", gpu_max_memory_bytes: "dot" } },
];

function emptySeries() {
  return { step: [], value: [], min: [], max: [] };
}

// The index of the point nearest to `step` in ascending `steps`.
function nearest(steps, step) {
  let lo = 0, hi = steps.length - 1;
  if (hi < 0) return -1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (steps[mid] < step) lo = mid + 1; else hi = mid;
  }
  return lo > 0 && Math.abs(steps[lo - 1] - step) < Math.abs(steps[lo] - step) ? lo - 1 : lo;
}

// Seconds of training up to each point of the `step_time` series: each point stands for the
// steps since the one before (a downsampled point for its whole bucket).
function elapsed(s) {
  let sum = 0;
  return s.step.map((step, i) => (sum += (s.value[i] ?? 0) * (i ? step - s.step[i - 1] : 1)));
}

// With smoothing, the raw line stays, faint, under the smoothed one.
function envelopeTraces(s, x, color, name, smoothing) {
  const hasEnvelope = s.min?.length === s.step.length;
  const raw = { x, y: s.value, mode: "lines", line: { color, width: 1.6 }, name };
  return [
    { x, y: hasEnvelope ? s.max : s.value, mode: "lines", line: { width: 0 },
      hoverinfo: "skip", showlegend: false, name: `${name} max` },
    { x, y: hasEnvelope ? s.min : s.value, mode: "lines", line: { width: 0 },
      fill: "tonexty", fillcolor: `${color}33`, hoverinfo: "skip", showlegend: false,
      name: `${name} min` },
    ...(smoothing ? [{ ...raw, opacity: 0.25, showlegend: false },
                     { ...raw, y: ema(s.value, smoothing), name: `${name} (smoothed)` }]
      : [raw]),
  ];
}

function hoverText(kind, item) {
  const lines = [`<b>${kind}</b> at step ${item.step}`];
  for (const [key, value] of Object.entries(item)) {
    if (["type", "job", "step", "time", "seq", "id"].includes(key) || value === "" || value === null) continue;
    const shown = typeof value === "object" ? JSON.stringify(value) : key.endsWith("bytes") ? bytes(value) : num(value);
    lines.push(`${key}: ${String(shown).slice(0, 120)}`);
  }
  return lines.join("<br>");
}

// The system chart's axes: CPU % above memory, one step axis below both.
function perRankLayout(xaxis, type) {
  return {
    xaxis: { ...xaxis, anchor: "y2" },
    yaxis: { domain: [0.56, 1], title: { text: "CPU %" }, rangemode: "tozero", type },
    yaxis2: { domain: [0, 0.44], title: { text: "memory" }, tickformat: ".3s", ticksuffix: "B",
              rangemode: "tozero", type },
    showlegend: true,
  };
}

// The per-source chart's axes: loss above, share of tokens below, one step axis below both.
function perSourceLayout(xaxis, type) {
  return {
    xaxis: { ...xaxis, anchor: "y2" },
    yaxis: { domain: [0.45, 1], title: { text: "loss" }, type },
    yaxis2: { domain: [0, 0.35], title: { text: "share" }, tickformat: ".0%", range: [0, 1.05] },
    showlegend: true,
  };
}

export class MetricCharts {
  // `markers()` returns {anomalies, actions, checkpoints} (arrays of events);
  // `onPickCheckpoint(checkpoint)` runs when a checkpoint marker is clicked.
  constructor(jobId, { markers, onPickCheckpoint }) {
    this.jobId = jobId;
    this.markers = markers;
    this.onPickCheckpoint = onPickCheckpoint;
    this.series = {};
    this.window = null; // [from, to] while zoomed
    this.pending = [];
    this.appended = 0;
    this.frame = null;
    this.fetching = 0;
    this.arrivedSinceFetch = null; // live step events since the newest refetch was asked for
    this.lossRedraw = new Throttled(LOSS_REDRAW_MS, (id) => this.draw(id));
    this.secondary = new Throttled(SECONDARY_REDRAW_MS, (id) => this.draw(id));
    this.prefs = bindPrefs((prefs) => {
      this.prefs = prefs;
      for (const id of Object.keys(CHARTS)) this.draw(id);
    });
  }

  // The x of each step on the chosen axis: tokens seen is the step times its tokens (the
  // global batch stays the same through reshards), training time the step times summed.
  xOf(steps) {
    const ref = this.series[{ tokens: "tokens", time: "step_time" }[this.prefs.x]];
    if (!ref?.step.length) return steps;
    const at = this.prefs.x === "tokens" ? ref.step.map((s, i) => s * ref.value[i]) : elapsed(ref);
    return steps.map((step) => at[nearest(ref.step, step)]);
  }

  // The step drawn nearest to `x` on the chosen axis (zooming works in steps).
  stepAt(x) {
    const steps = this.series.loss?.step ?? [];
    return this.prefs.x === "step" || !steps.length ? x : steps[nearest(this.xOf(steps), x)];
  }

  namesOf(id) {
    const chart = CHARTS[id];
    if (!chart.prefix) return chart.names;
    return Object.keys(this.series).filter((n) => prefixesOf(chart).some((p) => n.startsWith(p)))
      .sort();
  }

  allNames() {
    return Object.keys(CHARTS).flatMap((id) => (CHARTS[id].prefix ? [] : CHARTS[id].names));
  }

  // The snapshot's (or a fetch's) series replace what is drawn.
  load(series) {
    this.series = {};
    for (const [name, s] of Object.entries(series ?? {})) this.series[name] = { ...emptySeries(), ...s };
    this.appended = 0;
    for (const id of Object.keys(CHARTS)) this.draw(id);
  }

  // Until a series has a point, the chart says what it waits for: the first step, or nothing
  // once steps arrived without it (no GPU metrics on a CPU run).
  drawWaiting(id) {
    const chart = CHARTS[id];
    const text = this.series.loss?.step.length ? "not measured on this run" : undefined;
    Plotly.react(`chart-${id}`, [], waitingLayout(chart.title, chart.height ?? 260, text), CONFIG);
  }

  draw(id) {
    const chart = CHARTS[id];
    const target = `chart-${id}`;
    const names = this.namesOf(id);
    const drawn = names.some((n) => this.series[n]?.step.length);
    if (chart.perSource) document.getElementById("sources-card").hidden = !drawn;
    if (!drawn) { if (!chart.perSource) this.drawWaiting(id); return; }
    const traces = chart.perRank ? this.perRankTraces(names)
      : chart.perSource ? this.sourceTraces(names) : this.seriesTraces(chart, names);
    const xaxis = { title: { text: X_TITLES[this.prefs.x] },
                    range: this.window ? this.xOf(this.window) : undefined, autorange: !this.window };
    const type = this.prefs.log ? "log" : "linear";
    const layout = {
      title: { text: chart.title, font: { size: 14 } },
      margin: { l: 60, r: 16, t: 36, b: 36 },
      height: chart.height ?? 260,
      xaxis,
      yaxis: chart.bytes ? { tickformat: ".3s", ticksuffix: "B", type } : { type },
      legend: { orientation: "h", y: -0.25 },
      showlegend: names.length > 1 || Boolean(chart.markers),
      ...(chart.perRank ? perRankLayout(xaxis, type) : {}),
      ...(chart.perSource ? perSourceLayout(xaxis, type) : {}),
      uirevision: "keep",
      // the series arrays grow in place: a new revision tells Plotly.react to redraw them
      datarevision: (this.revision = (this.revision ?? 0) + 1),
    };
    const div = document.getElementById(target);
    this.applying = true;
    Plotly.react(div, traces, layout, CONFIG);
    this.applying = false;
    if (!div.dataset.bound) {
      div.dataset.bound = "1";
      div.on("plotly_relayout", (e) => this.relayout(e));
      if (chart.markers) div.on("plotly_click", (e) => this.click(e));
    }
  }

  // The main series with its envelope, the others as lines, then the markers.
  seriesTraces(chart, names) {
    const traces = [];
    names.forEach((name, i) => {
      const s = this.series[name] ?? emptySeries();
      const x = this.xOf(s.step);
      if (i === 0) traces.push(...envelopeTraces(s, x, chart.color, name, this.prefs.smoothing));
      else traces.push({ x, y: s.value, mode: "lines+markers", marker: { size: 5 }, name,
                         line: { width: 1.2, dash: name === "eval_loss" ? "dot" : "solid" } });
    });
    if (chart.markers) traces.push(...this.markerTraces());
    return traces;
  }

  // One line per rank and field of the `system.<field>.rank<r>` series.
  perRankTraces(names) {
    const traces = [];
    for (const { axis, fields } of SYSTEM_ROWS) {
      for (const name of names) {
        const [, field, rank] = name.split(".");
        if (!Object.hasOwn(fields, field) || !rank?.startsWith("rank")) continue;
        const r = Number(rank.slice("rank".length));
        const s = this.series[name];
        traces.push({ x: this.xOf(s.step), y: s.value, mode: "lines", yaxis: axis, name: `rank ${r}`,
                      legendgroup: rank, showlegend: field === "cpu_percent",
                      line: { color: rankColor(r), width: 1.4, dash: fields[field] },
                      hovertemplate: `rank ${r} ${field}: %{y:.3s}<extra></extra>` });
      }
    }
    return traces;
  }

  // Each source's training loss (and held-out loss, dotted) above, its share of the tokens
  // seen so far below (its cumulative tokens over all sources' at the same step).
  sourceTraces(names) {
    const of = (prefix) => names.filter((n) => n.startsWith(prefix))
      .map((n) => [n.slice(prefix.length), this.series[n]]);
    const totals = new Map();
    for (const [, s] of of("source_tokens.")) {
      s.step.forEach((step, i) => totals.set(step, (totals.get(step) ?? 0) + (s.value[i] ?? 0)));
    }
    const line = (source, s, y, extra) => ({
      x: this.xOf(s.step), y, mode: "lines", name: source, legendgroup: source,
      line: { color: colorOf(source), width: 1.6 }, ...extra });
    return [
      ...of("source_loss.").map(([source, s]) => line(source, s, s.value, {
        hovertemplate: `${source} loss: %{y:.4f}<extra></extra>` })),
      ...of("eval_source_loss.").map(([source, s]) => line(source, s, s.value, {
        mode: "lines+markers", marker: { size: 5 }, showlegend: false,
        line: { color: colorOf(source), width: 1.2, dash: "dot" },
        hovertemplate: `${source} held-out loss: %{y:.4f}<extra></extra>` })),
      ...of("source_tokens.").map(([source, s]) => line(source, s,
        s.value.map((v, i) => (totals.get(s.step[i]) ? (v ?? 0) / totals.get(s.step[i]) : null)), {
          yaxis: "y2", showlegend: false,
          hovertemplate: `${source} share: %{y:.1%}<extra></extra>` })),
    ];
  }

  markerTraces() {
    const loss = this.series.loss ?? emptySeries();
    const y = (step) => {
      const i = nearest(loss.step, step);
      return i < 0 ? null : (loss.max[i] ?? loss.value[i]);
    };
    const all = this.markers();
    return Object.entries(MARKERS).map(([kind, style]) => {
      const items = all[kind] ?? [];
      return {
        name: kind, mode: "markers", type: "scatter",
        x: this.xOf(items.map((e) => e.step)), y: items.map((e) => y(e.step)),
        text: items.map((e) => hoverText(MARKER_LABEL[kind](e), e)),
        hovertemplate: "%{text}<extra></extra>",
        marker: { color: style.color, symbol: style.symbol, size: style.size,
                  line: { width: 1, color: "#fff" } },
      };
    });
  }

  redrawMarkers() {
    this.draw("loss");
  }

  click(event) {
    // a checkpoint's diamond sits on the loss curve, so the click may land on the curve's
    // point at that step instead: either picks the checkpoint
    const points = event.points ?? [];
    const checkpoints = this.markers().checkpoints ?? [];
    const hit = points.find((p) => p.data.name === "checkpoints");
    const checkpoint = hit ? checkpoints[hit.pointIndex]
      : checkpoints.find((c) => points.some((p) => p.x === this.xOf([c.step])[0]));
    if (checkpoint) this.onPickCheckpoint(checkpoint);
  }

  // A live step event: queued, drawn on the next animation frame with the others.
  add(event) {
    this.pending.push(event);
    this.arrivedSinceFetch?.push(event);
    this.frame ??= requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = null;
    const events = this.pending;
    this.pending = [];
    if (!events.length) return;
    const touched = new Set();
    for (const event of events) {
      for (const [name, value] of Object.entries(flatten(event))) {
        const s = (this.series[name] ??= emptySeries());
        const v = typeof value === "number" ? value : null;
        // a step trained again (after a rollback or a restart) supersedes what was drawn
        // from it on, as in the stored series
        while (s.step.length && s.step.at(-1) >= event.step) {
          s.step.pop(); s.value.pop(); s.min.pop(); s.max.pop();
        }
        s.step.push(event.step); s.value.push(v); s.min.push(v); s.max.push(v);
        touched.add(name);
      }
    }
    this.appended += events.length;
    for (const id of Object.keys(CHARTS)) {
      if (!this.namesOf(id).some((n) => touched.has(n))) continue;
      (id === "loss" ? this.lossRedraw : this.secondary).mark(id);
    }
    if (this.appended > REFETCH_AT) this.refetch();
  }

  relayout(event) {
    if (this.applying) return;
    if (event["xaxis.autorange"]) {
      this.window = null;
    } else if ("xaxis.range[0]" in event || Array.isArray(event["xaxis.range"])) {
      const range = event["xaxis.range"] ?? [event["xaxis.range[0]"], event["xaxis.range[1]"]];
      this.window = [Math.max(0, Math.floor(this.stepAt(range[0]))), Math.ceil(this.stepAt(range[1]))];
    } else {
      return;
    }
    this.refetch();
  }

  // The series of the current window (all of them when not zoomed), downsampled by the server.
  async refetch() {
    const query = new URLSearchParams({ max_points: MAX_POINTS });
    const prefixed = Object.keys(this.series).filter((n) => PREFIXES.some((p) => n.startsWith(p)));
    query.set("names", [...this.allNames(), ...AXIS_NAMES, ...prefixed].join(","));
    if (this.window) { query.set("from", this.window[0]); query.set("to", this.window[1]); }
    const request = ++this.fetching;
    const arrived = this.arrivedSinceFetch = [];
    document.getElementById("job").dataset.metricsFetches =
      Number(document.getElementById("job").dataset.metricsFetches ?? 0) + 1;
    const { ok, data } = await api(`/api/jobs/${this.jobId}/metrics/?${query}`);
    if (!ok || request !== this.fetching) return;
    this.arrivedSinceFetch = null;
    this.load(data.series);
    // the server may have answered before it stored the steps that reached the page meanwhile
    // (the first steps after a rollback): they supersede what it sent from their step on
    for (const event of arrived) this.add(event);
  }
}

// A step event's numbers as stored series names (`memory.rss_bytes`), as the ingest does: a
// list holds one value per rank (`system.cpu_percent: [a, b]` -> `system.cpu_percent.rank0`).
function flatten(event, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(event)) {
    if (!prefix && ["type", "job", "step", "time", "seq"].includes(key)) continue;
    const inner = Array.isArray(value) ? Object.fromEntries(value.map((v, i) => [`rank${i}`, v])) : value;
    if (inner && typeof inner === "object") flatten(inner, `${prefix}${key}.`, out);
    else if (typeof value === "number" || ["nan", "inf", "-inf"].includes(value)) out[`${prefix}${key}`] = value;
  }
  return out;
}

// The goodput card: the job's wall-clock time as one stacked bar (productive training first,
// then each cause of loss) and a table of each cause's seconds and share, each linking to the
// events behind it. The ledger (monitor/goodput.py) comes with the socket's snapshot and again
// after every stored batch of events and every state change; in between, the interval still
// open (`open`: what the job is doing now) grows with the clock, as the server would count it,
// so a reloaded page shows what a watching one shows. It is drawn at most once a second: a
// fast job's batches arrive tens of times a second, and drawing the card for each of them
// took a third of the page's main thread.
import { CONFIG } from "./chartkit.js";
import { duration, el } from "./format.js";
import { Throttled } from "./throttle.js";

const REDRAW_EVERY_MS = 1000;

// one colour per cause, the same on every redraw: green for training, the losses apart
const COLORS = {
  productive: "#059669", queue: "#94a3b8", startup: "#64748b", checkpoint: "#0891b2",
  recovery: "#dc2626", retrained: "#ea580c", skipped: "#d97706", straggler: "#7c3aed",
  data: "#be185d", pause: "#2563eb", eval: "#65a30d",
};

const percent = (share) => `${(100 * share).toFixed(1)}%`;
const seconds = (s) => `${s.toFixed(1)} s`;

export class Goodput {
  constructor(jobId) {
    this.jobId = jobId;
    this.ledger = null;
    this.receivedAt = 0; // the browser's clock when the ledger arrived
    this.redraw = new Throttled(REDRAW_EVERY_MS, () => this.draw());
    setInterval(() => { if (this.ledger && !this.ledger.closed) this.redraw.mark("card"); },
                REDRAW_EVERY_MS);
  }

  show(ledger) {
    if (!ledger) return;
    this.ledger = ledger;
    this.receivedAt = Date.now() / 1000;
    this.redraw.mark("card");
  }

  // The ledger as of now: the open cause and the wall clock grown by the time since it came.
  now() {
    const { causes, open, closed, wall_s: wall } = this.ledger;
    const grown = closed ? 0 : Math.max(0, Date.now() / 1000 - this.receivedAt);
    const total = wall + grown;
    const entries = Object.entries(causes).map(([cause, entry]) => {
      const seconds = entry.seconds + (cause === open ? grown : 0);
      return { cause, label: entry.label, seconds, share: total > 0 ? seconds / total : 0 };
    });
    return { entries, wall: total };
  }

  draw() {
    const { entries, wall } = this.now();
    const shown = entries.filter((e) => e.seconds > 0);
    const traces = shown.map((e) => ({
      type: "bar", orientation: "h", name: e.label, y: ["wall clock"], x: [e.seconds],
      marker: { color: COLORS[e.cause] },
      hovertemplate: `${e.label}: ${duration(e.seconds)} (${percent(e.share)})<extra></extra>`,
    }));
    Plotly.react("chart-goodput", traces, {
      barmode: "stack", height: 160, showlegend: false,
      title: { text: `Goodput: ${percent(entries[0]?.share ?? 0)} of ${duration(wall)}`,
               font: { size: 14 } },
      margin: { l: 16, r: 16, t: 36, b: 40 }, yaxis: { visible: false },
      xaxis: { title: { text: "seconds" }, range: [0, Math.max(wall, 1e-3)] },
    }, CONFIG);
    document.getElementById("goodput-table").replaceChildren(...entries.map((e) => this.row(e)));
  }

  row(e) {
    const href = `/api/jobs/${this.jobId}/goodput/events/?cause=${e.cause}`;
    return el("tr", { dataset: { cause: e.cause } },
      el("td", {}, el("span", { class: "swatch", style: `background:${COLORS[e.cause]}` }),
         " ", e.label),
      el("td", { class: "num" }, seconds(e.seconds)),
      el("td", { class: "num" }, percent(e.share)),
      el("td", {}, el("a", { href, target: "_blank", rel: "noopener" }, "events")));
  }
}

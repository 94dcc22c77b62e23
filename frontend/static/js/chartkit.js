// What every chart of the pages shares: Plotly's options, a fixed colour per series name, and
// the layout of a chart with nothing to draw yet.

export const CONFIG = { responsive: true, displaylogo: false };

const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777",
                 "#65a30d", "#475569", "#ea580c", "#4f46e5", "#0d9488", "#b45309", "#9333ea",
                 "#be123c", "#15803d", "#1d4ed8", "#a16207", "#6d28d9", "#0e7490"];

// The same name gets the same colour on every page and every redraw, whatever else is drawn
// beside it (Plotly's default colours follow the trace order, which changes as ops appear).
export function colorOf(name) {
  let hash = 0;
  for (const char of name) hash = (hash * 31 + char.codePointAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
}

// A rank keeps its colour in every per-rank chart (system metrics, shares of the batch).
const RANK_COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777",
                     "#65a30d", "#475569", "#ea580c"];
export const rankColor = (rank) => RANK_COLORS[rank % RANK_COLORS.length];

// A chart before its data: the title and what it waits for, no axes (empty axes showed
// negative ranges that meant nothing).
export function waitingLayout(title, height, text = "waiting for the first step…") {
  return {
    title: { text: title, font: { size: 14 } }, height,
    margin: { l: 16, r: 16, t: 36, b: 16 },
    xaxis: { visible: false }, yaxis: { visible: false },
    annotations: [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
                    font: { size: 13, color: "#6b7280" } }],
  };
}

// The compare page: the loss and throughput of the chosen runs on shared axes. The choice
// lives in the address (`?jobs=3,5`), so a comparison can be shared as a link.
import { api } from "./api.js";

const form = document.getElementById("compare");
const METRICS = { loss: "Loss", tokens_per_s: "Throughput (tokens/s)" };
const MAX_POINTS = 1500;
const cache = new Map(); // job id -> its series

function chosen() {
  return [...form.querySelectorAll("input[name=job]:checked")].map((i) => i.value);
}

async function series(id) {
  if (!cache.has(id)) {
    const query = new URLSearchParams({ names: Object.keys(METRICS).join(","), max_points: MAX_POINTS });
    const { ok, data } = await api(`/api/jobs/${id}/metrics/?${query}`);
    cache.set(id, ok ? data.series : {});
  }
  return cache.get(id);
}

async function draw() {
  const ids = chosen();
  const url = new URL(location.href);
  if (ids.length) url.searchParams.set("jobs", ids.join(",")); else url.searchParams.delete("jobs");
  history.replaceState(null, "", url);
  const all = await Promise.all(ids.map(series));
  for (const [name, title] of Object.entries(METRICS)) {
    const traces = ids.map((id, i) => {
      const s = all[i][name] ?? { step: [], value: [] };
      const label = form.querySelector(`input[value="${id}"]`).dataset.label;
      return { x: s.step, y: s.value, mode: "lines", name: label, line: { width: 1.5 } };
    });
    Plotly.react(`compare-${name}`, traces, {
      title: { text: title, font: { size: 14 } }, height: 380, uirevision: "keep",
      margin: { l: 60, r: 16, t: 36, b: 40 }, xaxis: { title: { text: "step" } },
      legend: { orientation: "h", y: -0.2 },
    }, { responsive: true, displaylogo: false });
  }
  form.dataset.drawn = ids.join(",");
}

const initial = new URLSearchParams(location.search).get("jobs")?.split(",") ?? [];
for (const input of form.querySelectorAll("input[name=job]")) {
  input.checked = initial.includes(input.value);
  input.addEventListener("change", draw);
}
draw();

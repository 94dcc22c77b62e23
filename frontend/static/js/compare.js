// The compare page: any stored series of the chosen runs on shared axes, and their specs side
// by side with the fields that differ marked. The choice lives in the address
// (`?jobs=3,5&series=loss,lr`), so a comparison can be shared as a link.
import { api } from "./api.js";
import { CONFIG, colorOf } from "./chartkit.js";
import { el, num } from "./format.js";

const form = document.getElementById("compare");
const picker = document.getElementById("series-picker");
const chartsEl = document.getElementById("compare-charts");
const diffEl = document.getElementById("spec-diff");
const DEFAULT_SERIES = ["loss", "tokens_per_s"];
const MAX_POINTS = 1500;
const series = new Map(); // `${job} ${name}` -> its series
const jobs = new Map(); // job id -> the API's job (its spec), once read
const params = new URLSearchParams(location.search);
let wanted = params.get("series")?.split(",").filter(Boolean) ?? DEFAULT_SERIES;

function chosen() {
  return [...form.querySelectorAll("input[name=job]:checked")].map((i) => i.value);
}

function labelOf(id) {
  return form.querySelector(`input[value="${id}"]`).dataset.label;
}

async function job(id) {
  if (!jobs.has(id)) {
    const { ok, data } = await api(`/api/jobs/${id}/`);
    jobs.set(id, ok ? data : { spec: {} });
  }
  return jobs.get(id);
}

// Every series name any chosen run stored (a two-point read of each: its names are the keys).
async function namesOf(ids) {
  const answers = await Promise.all(ids.map((id) => api(`/api/jobs/${id}/metrics/?max_points=2`)));
  return [...new Set(answers.flatMap(({ ok, data }) => (ok ? Object.keys(data.series) : [])))].sort();
}

async function seriesOf(id, name) {
  const key = `${id} ${name}`;
  if (!series.has(key)) {
    const query = new URLSearchParams({ names: name, max_points: MAX_POINTS });
    const { ok, data } = await api(`/api/jobs/${id}/metrics/?${query}`);
    series.set(key, (ok && data.series[name]) || { step: [], value: [] });
  }
  return series.get(key);
}

function showPicker(names) {
  picker.replaceChildren(...names.map((name) => el("label", { class: "inline" },
    el("input", { type: "checkbox", value: name, checked: wanted.includes(name),
                  onchange: (e) => {
                    wanted = e.target.checked ? [...wanted, name] : wanted.filter((n) => n !== name);
                    draw();
                  } }), ` ${name}`)));
}

// A card per picked series, in the page before Plotly sizes its chart to the card.
function chartCards() {
  const divs = wanted.map((name) => document.getElementById(`compare-${name}`)
    ?? el("div", { id: `compare-${name}`, class: "chart chart-tall" }));
  chartsEl.replaceChildren(...divs.map((div) => el("div", { class: "card" }, div)));
  return divs;
}

async function drawSeries(ids, name, div) {
  const all = await Promise.all(ids.map((id) => seriesOf(id, name)));
  const traces = ids.map((job, i) => ({ x: all[i].step, y: all[i].value, mode: "lines", name: labelOf(job),
                                        line: { width: 1.5, color: colorOf(labelOf(job)) } }));
  Plotly.react(div, traces, {
    title: { text: name, font: { size: 14 } }, height: 380, uirevision: "keep",
    margin: { l: 60, r: 16, t: 36, b: 40 }, xaxis: { title: { text: "step" } },
    legend: { orientation: "h", y: -0.2 },
  }, CONFIG);
  Plotly.Plots.resize(div); // a card added beside it narrowed the grid's columns
}

// -- the specs side by side --------------------------------------------------------------
function flat(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, inner] of Object.entries(value)) flat(inner, prefix ? `${prefix}.${key}` : key, out);
  } else {
    out[prefix] = Array.isArray(value) ? JSON.stringify(value) : value;
  }
  return out;
}

async function drawDiff(ids) {
  const specs = (await Promise.all(ids.map(job))).map((j) => flat(j.spec));
  const fields = [...new Set(specs.flatMap(Object.keys))].sort();
  const differs = (field) => new Set(specs.map((s) => JSON.stringify(s[field]))).size > 1;
  const showAll = document.getElementById("diff-all").checked;
  const shown = fields.filter((f) => showAll || differs(f));
  diffEl.replaceChildren(
    el("thead", {}, el("tr", {}, el("th", {}, "field"), ids.map((id) => el("th", {}, labelOf(id))))),
    el("tbody", {}, shown.map((f) => el("tr", { class: differs(f) ? "differs" : "", dataset: { field: f } },
      el("td", {}, f), specs.map((s) => el("td", {}, s[f] === undefined ? "–" : num(s[f])))))));
  document.getElementById("diff-count").textContent = ids.length > 1
    ? `${fields.filter(differs).length} of ${fields.length} fields differ` : "";
}

async function draw() {
  const ids = chosen();
  const url = new URL(location.href);
  if (ids.length) url.searchParams.set("jobs", ids.join(",")); else url.searchParams.delete("jobs");
  // the default choice stays out of the link
  if (wanted.join(",") === DEFAULT_SERIES.join(",")) url.searchParams.delete("series");
  else url.searchParams.set("series", wanted.join(","));
  history.replaceState(null, "", url);
  showPicker(await namesOf(ids));
  const divs = chartCards();
  await Promise.all(wanted.map((name, i) => drawSeries(ids, name, divs[i])));
  await drawDiff(ids);
  form.dataset.drawn = ids.join(",");
}

const initial = params.get("jobs")?.split(",") ?? [];
for (const input of form.querySelectorAll("input[name=job]")) {
  input.checked = initial.includes(input.value);
  input.addEventListener("change", draw);
}
document.getElementById("diff-all").addEventListener("change", () => drawDiff(chosen()));
draw();

// The job list, read from the REST API: search and filters (name, state, tag; owner for
// staff), sortable columns, pages of PAGE jobs, each with its progress, last loss, tokens/s,
// duration, tags and note (editable in place). The choice lives in the address, so a
// filtered list can be shared as a link. State changes arrive over `/ws/jobs/` and update the
// rows in place; a job not on the page (launched elsewhere) brings the page up to date.
import { api } from "./api.js";
import { duration, el, errorText, num, rows, where } from "./format.js";

const PAGE = 25;
const FILTERS = ["name", "state", "tag", "owner"];
const body = document.getElementById("job-rows");
const filters = document.getElementById("job-filters");
const compare = document.getElementById("compare-picked");
const query = new URLSearchParams(location.search);
const picked = new Set();
let shown = new Map(); // job id -> the API's job, for the rows on the page
let loads = 0; // the newest load's number: an older answer arriving later is dropped

function label(state) {
  const text = state.replaceAll("_", " ");
  return text[0].toUpperCase() + text.slice(1);
}

// -- one row -----------------------------------------------------------------------------
function showState(tr, job) {
  const badge = tr.querySelector(".state");
  badge.className = `state state-${job.state}`;
  badge.textContent = label(job.state);
  const share = job.total_steps ? Math.min(1, job.step / job.total_steps) : 0;
  tr.querySelector(".progress > div").style.width = `${(share * 100).toFixed(1)}%`;
  tr.querySelector(".step").textContent = `${job.step} / ${job.total_steps}`;
  tr.querySelector(".where").textContent = where(job);
}


function elapsed(job) {
  if (!job.started_at) return "–";
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return duration((end - Date.parse(job.started_at)) / 1000);
}

function tagChips(job) {
  return job.tags.map((tag) => el("button", { type: "button", class: "chip", title: "show jobs with this tag",
                                              onclick: () => setFilter("tag", tag) }, tag));
}

function row(job) {
  const check = el("input", { type: "checkbox", value: job.id, checked: picked.has(String(job.id)),
                              "aria-label": `pick #${job.id} to compare`, onchange: pick });
  const tr = el("tr", { dataset: { jobId: job.id } },
    el("td", {}, check),
    el("td", {}, job.id),
    el("td", { class: "name" }, el("a", { href: `/jobs/${job.id}/` }, job.name),
      el("div", { class: "note muted" }, job.note)),
    el("td", {}, el("span", { class: "state" }), el("div", { class: "where muted" })),
    el("td", { class: "progress-cell" }, el("div", { class: "progress" }, el("div")),
      el("span", { class: "step muted" })),
    el("td", { class: "loss num" }, "–"),
    el("td", { class: "tokens num" }, "–"),
    el("td", { class: "num" }, elapsed(job)),
    el("td", { class: "tags" }, tagChips(job)),
    el("td", {}, job.owner),
    el("td", {}, el("button", { type: "button", class: "link edit", onclick: () => edit(tr, job) }, "Edit")));
  showState(tr, job);
  lastValues(tr, job);
  return tr;
}

// The loss and throughput of the job's last step (a window of one step is never downsampled).
async function lastValues(tr, job) {
  if (!job.step) return;
  const window = new URLSearchParams({ names: "loss,tokens_per_s", from: job.step, to: job.step });
  const { ok, data } = await api(`/api/jobs/${job.id}/metrics/?${window}`);
  if (!ok) return;
  const last = (name) => data.series[name]?.value.at(-1);
  tr.querySelector(".loss").textContent = num(last("loss"));
  tr.querySelector(".tokens").textContent = num(last("tokens_per_s"), 3);
}

// -- tags and note, edited in place --------------------------------------------------------
function edit(tr, job) {
  const tags = el("input", { name: "tags", value: job.tags.join(", "), placeholder: "tags, comma-separated" });
  const note = el("textarea", { name: "note", rows: 2, placeholder: "note" });
  note.value = job.note;
  const error = el("span", { class: "error", "aria-live": "polite" });
  const save = async (event) => {
    event.preventDefault();
    const { ok, status, data } = await api(`/api/jobs/${job.id}/`, { method: "PATCH", body: {
      tags: tags.value.split(",").map((t) => t.trim().toLowerCase()).filter(Boolean), note: note.value } });
    if (!ok) { error.textContent = errorText(data, status); return; }
    shown.set(job.id, data);
    tr.replaceWith(row(data));
  };
  const form = el("form", { class: "edit-form", onsubmit: save }, tags, note,
    el("button", { class: "button primary" }, "Save"),
    el("button", { type: "button", class: "link", onclick: () => tr.replaceWith(row(job)) }, "Cancel"), error);
  tr.querySelector(".tags").replaceChildren(form);
  tags.focus();
}

// A reload (the socket's snapshot, on connecting and after a drop) must not throw away a
// half-written tags or note edit: its row stays, with the cells a push would update.
function rowKeepingAnOpenEdit(job) {
  const tr = body.querySelector(`tr[data-job-id="${job.id}"]`);
  if (!tr?.querySelector(".edit-form")) return row(job);
  showState(tr, job);
  lastValues(tr, job);
  return tr;
}

// -- the page: filters, sorting, pages -----------------------------------------------------
function pick(event) {
  if (event.target.checked) picked.add(event.target.value); else picked.delete(event.target.value);
  compare.disabled = picked.size === 0;
}

function setFilter(name, value) {
  if (value) query.set(name, value); else query.delete(name);
  query.delete("offset");
  if (filters.elements[name]) filters.elements[name].value = value;
  load();
}

function sortBy(field) {
  const now = query.get("ordering");
  query.set("ordering", now === field ? `-${field}` : field);
  query.delete("offset");
  load();
}

async function load() {
  history.replaceState(null, "", `${location.pathname}${query.size ? `?${query}` : ""}`);
  const offset = Number(query.get("offset") ?? 0);
  const params = new URLSearchParams({ limit: PAGE, offset });
  for (const name of [...FILTERS, "ordering"]) if (query.get(name)) params.set(name, query.get(name));
  const request = ++loads;
  const { ok, status, data } = await api(`/api/jobs/?${params}`);
  if (request !== loads) return;
  const info = document.getElementById("page-info");
  if (!ok) { info.textContent = errorText(data, status); return; }
  const jobs = rows(data);
  shown = new Map(jobs.map((job) => [job.id, job]));
  body.replaceChildren(...jobs.map(rowKeepingAnOpenEdit));
  document.getElementById("no-jobs").hidden = jobs.length > 0;
  info.textContent = data.count ? `${offset + 1}–${offset + jobs.length} of ${data.count}` : "";
  document.getElementById("newer").disabled = offset === 0;
  document.getElementById("older").disabled = offset + PAGE >= data.count;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    const ordering = query.get("ordering") ?? "-created_at";
    th.dataset.order = ordering === th.dataset.sort ? "asc" : ordering === `-${th.dataset.sort}` ? "desc" : "";
  }
  body.dataset.loaded = String(Number(body.dataset.loaded ?? 0) + 1); // what the tests wait for
}

function page(delta) {
  query.set("offset", Math.max(0, Number(query.get("offset") ?? 0) + delta * PAGE));
  load();
}

// -- live --------------------------------------------------------------------------------
function onJob(message) {
  const tr = body.querySelector(`tr[data-job-id="${message.job}"]`);
  if (!tr) { load(); return; } // a job new to this page may belong on it
  // a state change may come with new hosts (placed, lost a host, grew back): the message has them
  const { state, step, placement, waiting_reason: waitingReason } = message;
  const job = { ...shown.get(message.job), state, step, placement, waiting_reason: waitingReason };
  shown.set(message.job, job);
  showState(tr, job); // the row's cells only: a tags or note edit open in it stays as it is
  lastValues(tr, job);
}

let retry = 500;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/`);
  socket.onopen = () => { retry = 500; };
  socket.onmessage = ({ data }) => {
    const message = JSON.parse(data);
    if (message.type === "job") onJob(message);
    else if (message.type === "snapshot" && body.dataset.loaded) load(); // back after a drop
  };
  socket.onclose = (event) => {
    if (event.code === 4401) return;
    setTimeout(connect, retry);
    retry = Math.min(retry * 2, 10000);
  };
}

for (const name of FILTERS) {
  const input = filters.elements[name];
  if (!input) continue; // owner: staff only
  input.value = query.get(name) ?? "";
  input.addEventListener(input.tagName === "SELECT" ? "change" : "input", () => setFilter(name, input.value.trim()));
}
filters.addEventListener("submit", (event) => event.preventDefault());
for (const th of document.querySelectorAll("th[data-sort]")) {
  th.addEventListener("click", () => sortBy(th.dataset.sort));
}
document.getElementById("newer").addEventListener("click", () => page(-1));
document.getElementById("older").addEventListener("click", () => page(1));
compare.addEventListener("click", () => location.assign(`/compare/?jobs=${[...picked].join(",")}`));
load();
connect();

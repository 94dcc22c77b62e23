// The Datasets page: register one (POST /api/datasets/), prepare or delete it, and watch a
// prepare's progress (documents, tokens, MB/s, ETA), polled from the API while one runs; a
// ready dataset shows its manifest (tokenizer, vocabulary, tokens per split).
import { api } from "./api.js";
import { duration, el, errorText, num, rows } from "./format.js";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
const count = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");
let timer = null;

function progressText(d) {
  const p = d.progress ?? {};
  if (d.state !== "preparing" && d.state !== "ready") return "";
  if (p.documents === undefined) return d.state === "preparing" ? "queued…" : "";
  const share = p.bytes_total ? ` (${Math.round((100 * p.bytes_read) / p.bytes_total)}%)` : "";
  const pace = d.state === "preparing"
    ? ` · ${num(p.mb_per_s, 3)} MB/s · ETA ${p.eta_s === null ? "–" : duration(p.eta_s)}` : "";
  return `${count(p.documents)} documents · ${count(p.tokens)} tokens${share}${pace}`;
}

function manifestText(d) {
  if (!d.manifest) return d.error ? `failed: ${d.error}` : "";
  const m = d.manifest, s = m.splits ?? {};
  return `vocabulary ${m.tokenizer?.vocab_size} (${m.tokenizer?.name ?? ""}, sha256 `
    + `${String(m.tokenizer?.sha256 ?? "").slice(0, 12)}) · train ${count(s.train?.tokens)} tokens `
    + `in ${count(s.train?.documents)} documents · held out ${count(s.heldout?.tokens)} tokens`;
}

function sourcesText(d) {
  return d.sources.map((s) => `${s.kind}${s.kind === "text" ? "" : `[${s.field}]`}: ${s.paths.join(", ")}`)
    .join("; ");
}

async function act(path, method) {
  const { ok, status, data } = await api(path, { method, body: method === "POST" ? {} : undefined });
  $("dataset-error").hidden = ok;
  if (!ok) $("dataset-error").textContent = errorText(data, status);
  load();
}

function row(d) {
  const who = $("datasets").dataset;
  const mine = d.owner === who.user || who.staff === "1";
  const canPrepare = mine && ["registered", "failed"].includes(d.state);
  return el("tr", { dataset: { id: d.id, state: d.state } },
    el("td", {}, d.name, d.shared ? el("span", { class: "muted" }, " (shared)") : null),
    el("td", {}, d.owner),
    el("td", { class: "sources" }, sourcesText(d)),
    el("td", {}, d.tokenizer.split("/").at(-1)),
    el("td", {}, el("span", { class: `state state-${d.state}` }, d.state)),
    el("td", { class: "progress-text" }, progressText(d)),
    el("td", { class: "manifest" }, manifestText(d)),
    el("td", {},
      canPrepare ? el("button", { onclick: () => act(`/api/datasets/${d.id}/prepare/`, "POST") },
        d.state === "failed" ? "Prepare again" : "Prepare") : null,
      mine ? el("button", { class: "danger", onclick: () => act(`/api/datasets/${d.id}/`, "DELETE") },
        "Delete") : null));
}

async function load() {
  const { ok, status, data } = await api("/api/datasets/?limit=500");
  if (!ok) { $("dataset-error").hidden = false; $("dataset-error").textContent = errorText(data, status); return; }
  const found = rows(data);
  $("dataset-rows").replaceChildren(...found.map(row));
  $("no-datasets").hidden = found.length > 0;
  clearTimeout(timer);
  if (found.some((d) => d.state === "preparing")) timer = setTimeout(load, POLL_MS);
}

$("register").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const paths = form.get("paths").split("\n").map((p) => p.trim()).filter(Boolean);
  const body = { name: form.get("name"), tokenizer: form.get("tokenizer"),
                 holdout: Number(form.get("holdout")),
                 sources: [{ kind: form.get("kind"), paths, field: form.get("field") }] };
  const { ok, status, data } = await api("/api/datasets/", { method: "POST", body });
  $("register-error").textContent = ok ? "" : errorText(data, status);
  if (ok) event.target.reset();
  load();
});
$("register").querySelector("button").disabled = false;

load();

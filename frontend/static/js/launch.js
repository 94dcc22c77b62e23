// The launch form: builds a job spec from the fields, POSTs it to /api/jobs/ and shows the
// API's field errors next to the fields they name. The planner table below follows the
// model and layout fields as they change. A clone (`/jobs/new/?clone=<id>`) starts with the
// fields filled from that job's spec, embedded in the page.
import { api } from "./api.js";
import { el } from "./format.js";
import { PlanTable } from "./plan.js";

const form = document.getElementById("launch");
const injectRows = document.getElementById("inject-rows");
const strategy = form.querySelector("select[name='parallel.strategy']");

// "train.steps" = "20" → spec.train.steps = 20; "faults.inject.0.kind" fills a list. Text that
// is not a number is sent as typed, so that the API (not the browser) says what is wrong.
// Empty optional fields are left out (the engine's default applies); `data-list` fields are
// comma-separated lists, `data-json` fields JSON objects merged into their place.
function buildSpec() {
  const spec = {};
  const jsonErrors = {};
  for (const input of form.querySelectorAll("input[name], select[name], textarea[name]")) {
    const raw = input.value.trim();
    if (raw === "" && "optional" in input.dataset) continue;
    let value;
    if ("json" in input.dataset) {
      try { value = JSON.parse(raw); } catch (e) { jsonErrors[input.name] = `not valid JSON: ${e.message}`; continue; }
    } else if ("list" in input.dataset) {
      value = raw.split(",").map((v) => v.trim()).filter(Boolean);
    } else {
      value = input.type === "number" && raw !== "" && !Number.isNaN(Number(raw)) ? Number(raw) : raw;
    }
    const path = input.name.split(".");
    let node = spec;
    path.slice(0, -1).forEach((key, i) => {
      node = node[key] ??= /^\d+$/.test(path[i + 1]) ? [] : {};
    });
    const last = path.at(-1);
    node[last] = "json" in input.dataset && typeof node[last] === "object" && node[last] !== null
      ? { ...value, ...node[last] } : value;
  }
  return { spec, jsonErrors };
}

// The slot of a field's message: its own, else a new one after the field's input, else the
// nearest enclosing field's ("faults.policy.actions.hang.0" → "...actions.hang"), else the top.
function slotFor(field) {
  const parts = field.split(".");
  for (let n = parts.length; n > 0; n -= 1) {
    const path = parts.slice(0, n).join(".");
    const slot = form.querySelector(`[data-error-for="${CSS.escape(path)}"]`);
    if (slot) return slot;
    const input = form.querySelector(`[name="${CSS.escape(path)}"]`);
    if (input) {
      const made = el("small", { class: "error", dataset: { errorFor: path } });
      input.after(made);
      return made;
    }
  }
  return null;
}

function showErrors(errors) {
  for (const slot of form.querySelectorAll("[data-error-for]")) {
    slot.textContent = "";
    slot.hidden = slot.dataset.errorFor === "";
  }
  const general = form.querySelector('[data-error-for=""]');
  for (const [field, message] of Object.entries(errors)) {
    const slot = field ? slotFor(field) : null;
    const target = slot ?? general;
    const exact = slot?.dataset.errorFor === field;
    target.textContent += (exact ? message : `${field || "spec"}: ${message}`) + " ";
    target.hidden = false;
  }
  scrollToFirstError();
}

// The form is long: bring its first message (in page order) into view, and its field into focus.
function scrollToFirstError() {
  const first = [...form.querySelectorAll("[data-error-for]")].find((slot) => !slot.hidden && slot.textContent);
  if (!first) return;
  first.scrollIntoView({ block: "center", behavior: "smooth" });
  form.querySelector(`[name="${CSS.escape(first.dataset.errorFor)}"]`)?.focus({ preventScroll: true });
}

// -- injected faults: rows named faults.inject.<i>.<field>, renumbered on removal ----------
function renumber() {
  [...injectRows.children].forEach((row, i) => {
    for (const input of row.querySelectorAll("[data-field]")) input.name = `faults.inject.${i}.${input.dataset.field}`;
  });
}

function addFault() {
  const row = document.getElementById("inject-template").content.firstElementChild.cloneNode(true);
  row.querySelector(".remove-fault").addEventListener("click", () => { row.remove(); renumber(); });
  injectRows.append(row);
  renumber();
}
document.getElementById("add-fault").addEventListener("click", addFault);

// -- a clone: every field from the job's spec, the reverse of buildSpec --------------------
function fill({ spec, preset, model_overrides: overrides }) {
  for (const _ of spec.faults?.inject ?? []) addFault(); // rows first: then they have names
  for (const input of form.querySelectorAll("input[name], select[name], textarea[name]")) {
    const value = input.name === "model.preset" ? preset
      : input.name === "model" ? overrides
        : input.name.split(".").reduce((node, key) => node?.[key], spec);
    if (value === undefined || value === null) continue;
    if ("json" in input.dataset) input.value = Object.keys(value).length ? JSON.stringify(value) : "";
    else if ("list" in input.dataset) input.value = value.join(", ");
    else input.value = value;
  }
}
const clone = document.getElementById("clone-from");
if (clone) fill(JSON.parse(clone.textContent));

// -- planner ----------------------------------------------------------------------------------
const launch = form.querySelector("button[type=submit]");
const refusedNote = document.getElementById("launch-refused");
// why the server would refuse this model and layout (no registered host holds it in any
// strategy: jobs.admission); null: Launch is on
let refused = null;
function showRefused(reason) {
  refused = reason;
  launch.disabled = Boolean(reason);
  launch.title = reason ? `No registered host can hold this model: ${reason}` : "";
  refusedNote.hidden = !reason;
  refusedNote.textContent = reason ? `Launch is off: ${reason}. Shard it over more ranks or pick a smaller model.` : "";
}
const plan = new PlanTable(document.getElementById("launch-plan"), {
  onPick: (s) => { strategy.value = s; },
  selected: () => strategy.value,
  onLoad: (answer) => showRefused(answer.refused),
});

function replan() {
  const params = { preset: form.querySelector("[name='model.preset']").value };
  for (const input of form.querySelectorAll("[data-plan]")) params[input.dataset.plan] = input.value.trim();
  plan.update(params);
}
for (const input of form.querySelectorAll("[data-plan], [name='model.preset']")) input.addEventListener("input", replan);
strategy.addEventListener("change", () => plan.mark(strategy.value));
replan();

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const { spec, jsonErrors } = buildSpec();
  if (Object.keys(jsonErrors).length) {
    showErrors(jsonErrors);
    return;
  }
  launch.disabled = true;
  const { ok, status, data } = await api("/api/jobs/", { method: "POST", body: spec });
  launch.disabled = Boolean(refused);
  if (ok) {
    window.location.assign(`/jobs/${data.id}/`);
  } else if (status === 400 && data?.errors) {
    showErrors(data.errors);
  } else {
    showErrors({ "": data?.detail ?? `the server answered ${status}` });
  }
});
launch.disabled = Boolean(refused);

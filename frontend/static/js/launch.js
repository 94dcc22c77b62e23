// The launch form: builds a job spec from the fields, POSTs it to /api/jobs/ and shows the
// API's field errors next to the fields they name.
import { api } from "./api.js";

const form = document.getElementById("launch");

// "train.steps" = "20" → spec.train.steps = 20. Text that is not a number is sent as typed,
// so that the API (not the browser) says what is wrong with it.
function buildSpec() {
  const spec = {};
  for (const input of form.querySelectorAll("input[name], select[name]")) {
    const path = input.name.split(".");
    const raw = input.value.trim();
    const value = input.type === "number" && raw !== "" && !Number.isNaN(Number(raw)) ? Number(raw) : raw;
    let node = spec;
    for (const key of path.slice(0, -1)) node = node[key] ??= {};
    node[path.at(-1)] = value;
  }
  return spec;
}

function showErrors(errors) {
  for (const el of form.querySelectorAll("[data-error-for]")) {
    el.textContent = "";
    el.hidden = el.dataset.errorFor === "";
  }
  const general = form.querySelector('[data-error-for=""]');
  for (const [field, message] of Object.entries(errors)) {
    const slot = form.querySelector(`[data-error-for="${CSS.escape(field)}"]`);
    const target = slot ?? general;
    target.textContent += (slot ? message : `${field || "spec"}: ${message}`) + " ";
    target.hidden = false;
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  const { ok, status, data } = await api("/api/jobs/", { method: "POST", body: buildSpec() });
  button.disabled = false;
  if (ok) {
    window.location.assign(`/jobs/${data.id}/`);
  } else if (status === 400 && data?.errors) {
    showErrors(data.errors);
  } else {
    showErrors({ "": data?.detail ?? `the server answered ${status}` });
  }
});

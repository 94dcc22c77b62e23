// The job page's proposals: actions of the fault policy that wait for a person
// (`faults.policy.approve`). Each shows its anomaly's evidence, its deadline and the default
// taken then; while pending, the buttons that answer it (POST
// /api/jobs/<id>/proposals/<pid>/decide/). A proposal's later `proposal` event (decided, or
// timed out) replaces it; the same after a reload (the snapshot's events) as live.
import { api } from "./api.js";
import { el, errorText, fieldsText } from "./format.js";

const STATUS = { pending: "waiting for you", approved: "approved", chosen: "another action chosen",
                 dismissed: "dismissed", timed_out: "timed out" };

export class Proposals {
  constructor(jobId, actions) {
    this.jobId = jobId;
    this.actions = actions; // what a person may choose instead (the ladder's actions)
    this.card = document.getElementById("proposals-card");
    this.list = document.getElementById("proposals");
    this.latest = new Map(); // proposal id -> its newest event
  }

  // a `proposal` event, live or from the snapshot; an older word than the one shown is ignored
  add(event) {
    const shown = this.latest.get(event.id);
    if (shown && shown.seq >= event.seq) return;
    this.latest.set(event.id, event);
    const item = this.item(event);
    const old = [...this.list.children].find((li) => li.dataset.id === event.id);
    if (old) old.replaceWith(item); else this.list.prepend(item);
    this.card.hidden = false;
  }

  item(p) {
    const evidence = fieldsText(p.evidence);
    const deadline = new Date(p.deadline * 1000).toLocaleTimeString();
    const what = p.status === "pending"
      ? `decide by ${deadline}, else ${p.default}${p.hold ? " (the run holds until then)" : " (the run trains on)"}`
      : `${STATUS[p.status] ?? p.status}: took ${p.take} at step ${p.step} (by ${p.by})`;
    return el("li", { dataset: { id: p.id, status: p.status, action: p.action } },
      el("strong", {}, `Proposed ${p.action}`), ` for ${p.anomaly} at step ${p.step}`,
      evidence ? ` · ${evidence}` : "", el("div", { class: "proposal-state" }, what),
      p.status === "pending" ? this.buttons(p) : null);
  }

  buttons(p) {
    const result = el("span", { class: "proposal-result muted" });
    const other = el("select", { class: "proposal-other", "aria-label": "another action" },
      this.actions.filter((a) => a !== p.action).map((a) => el("option", { value: a }, a)));
    const send = (body) => this.decide(p, body, result);
    return el("div", { class: "proposal-buttons" },
      el("button", { class: "primary approve", onclick: () => send({ choice: "approve" }) }, `Approve ${p.action}`),
      other,
      el("button", { class: "choose", onclick: () => send({ choice: "choose", action: other.value }) }, "Take instead"),
      el("button", { class: "dismiss", onclick: () => send({ choice: "dismiss" }) }, "Dismiss"),
      result);
  }

  async decide(p, body, result) {
    const { ok, status, data } = await api(
      `/api/jobs/${this.jobId}/proposals/${encodeURIComponent(p.id)}/decide/`, { method: "POST", body });
    result.textContent = ok ? `${body.choice} sent; waiting for the engine…`
      : `refused: ${errorText(data, status)}`;
  }
}

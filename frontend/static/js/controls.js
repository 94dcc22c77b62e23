// The job page's controls. Each one is a command to the API (202 with the command); its
// result appears when the engine acknowledges it: the `action` event naming the command id,
// or the command's own state, pushed over the job's socket at every move (monitor.pushes). A
// command is "done" on the page only once its effect shows: the API settles a resume or a
// reshard before the engine runs again, so those wait for the job to run and step.
import { api } from "./api.js";
import { Evaluations } from "./evaluations.js";
import { Exports } from "./exports.js";
import { bytes, duration, el, errorText, sharesText } from "./format.js";
import { PlanTable } from "./plan.js";
import { worldOf } from "./shares.js";
import { ActionName, CheckpointTier, CommandKind, JobState, SpecDefaults } from "./vocabulary.js";

// the command buttons; clone is no command (it opens the launch form) and is always allowed
const LABEL = { pause: "Pause", resume: "Resume", cancel: "Cancel", checkpoint: "Checkpoint",
                rollback: "Rollback", reshard: "Reshard", set: "Set", rebalance: "Rebalance" };
// the commands sent from elsewhere on the page (the proposals card), listed with the others
const OTHER_LABEL = { decide: "Decision" };
const label = (kind) => LABEL[kind] ?? OTHER_LABEL[kind] ?? kind;
// the commands whose button opens a panel; the panel's own buttons send the command
const PANELS = ["rollback", "reshard", "set", "rebalance"];
// the commands whose effect is the engine running again: done at its first step after them
const RUNS_AGAIN = new Set([CommandKind.RESUME, CommandKind.RESHARD]);
// the buttons that stay disabled until their command is settled (a second checkpoint click
// before the first is written would only queue another)
const HOLD = new Set(["checkpoint"]);
const WAITING = "waiting for the engine…";
// an abandoned checkpoint the engine deleted: listed as history, no rollback target
const gone = (c) => c.branch === "abandoned" && c.available === false;
// the job's states on its way back to running after a resume or reshard
const COMING_BACK = new Set([JobState.QUEUED, JobState.STARTING, JobState.RESHARDING, JobState.PAUSED_WARM,
                             JobState.WAITING_FOR_HOSTS]);

// "10, 10, 10, 2" as a list of samples per rank; other text goes as it is, for the API to
// say what is wrong with it (or to take "auto" or "even")
function parseShares(text) {
  const parts = text.split(",").map((part) => part.trim());
  return parts.every((part) => /^\d+$/.test(part)) ? parts.map(Number) : text.trim();
}

// a `set` action's changes: "train.lr 0.002 → 0.0005"
const changesText = (changes) => Object.entries(changes ?? {})
  .map(([key, c]) => `${key} ${JSON.stringify(c.old)} → ${JSON.stringify(c.new)}`).join(", ");

function describe(result) {
  if (!result || typeof result !== "object") return result ? String(result) : "";
  const parts = [];
  if (result.from_step !== undefined && result.to_step !== undefined) {
    parts.push(`step ${result.from_step} → ${result.to_step}`);
  }
  if (result.skip_data) parts.push("data window skipped");
  if (result.settings) parts.push(`settings ${result.settings}`);
  if (result.changes) parts.push(changesText(result.changes));
  if (result.shares) parts.push(sharesText(result.shares));
  if (result.proposal) parts.push(`${result.proposal} ${result.choice}, took ${result.take}`);
  if (result.parallel) {
    const p = result.parallel;
    parts.push(`${p.strategy} on ${p.nodes}×${p.procs_per_node}`);
  }
  const path = result.checkpoint ?? result.path;
  if (path) parts.push(String(path).split("/").pop());
  if (result.error) parts.push(result.error);
  if (result.state) parts.push(`job ${result.state}`);
  return parts.join(", ");
}

export class Controls {
  constructor(job) {
    this.job = job; // {id, spec, state(), actions(), shares(): the ranks' shares now}
    this.commands = new Map(); // id -> {kind, entry, ran (its effect seen), doneText}
    this.sending = 0; // commands of this page's whose POST has not answered yet
    this.early = new Map(); // id -> a pushed command not known here while one was sending
    this.held = new Map(); // a HOLD kind -> the id of its command not settled yet
    this.checkpoints = [];
    this.picked = null;
    this.resultEl = document.getElementById("action-result");
    this.list = document.getElementById("results");
    this.rules = {}; // kind -> {allowed_in, moves_to}: the API's, once loadRules has them
    for (const kind of [...Object.keys(LABEL), "clone"]) {
      document.getElementById(kind).addEventListener("click", () => this.click(kind));
    }
    // a warm pause keeps the ranks in memory (the worker stays held); resume is immediate
    document.getElementById("pause-warm").addEventListener("click", () => this.send("pause", { mode: "warm" }, "pause-warm"));
    this.evaluations = new Evaluations(job.id, document.getElementById("evaluations"));
    this.exports = new Exports(job.id, document.getElementById("export-list"),
                               (c) => this.evaluations.button(c));
    document.getElementById("rollback-go").addEventListener("click", () => this.rollback());
    document.getElementById("reshard-go").addEventListener("click", () => this.reshard());
    document.getElementById("set-go").addEventListener("click", () => this.set());
    // the ranks' shares of the step's batch: a list of samples per rank, "auto" (follow the
    // ranks' speeds) or "even"
    this.shares = document.getElementById("rebalance-shares");
    const rebalance = (shares) => this.send("rebalance", { shares });
    document.getElementById("rebalance-go").addEventListener("click",
      () => rebalance(parseShares(this.shares.value)));
    document.getElementById("rebalance-auto").addEventListener("click", () => rebalance("auto"));
    document.getElementById("rebalance-even").addEventListener("click", () => rebalance("even"));
    const layout = { ...SpecDefaults.parallel, ...job.spec.parallel };
    this.nodes = document.getElementById("reshard-nodes");
    this.procs = document.getElementById("reshard-procs");
    this.nodes.value = layout.nodes;
    this.procs.value = layout.procs_per_node;
    this.strategy = layout.strategy;
    this.plan = new PlanTable(document.getElementById("reshard-plan"), {
      onPick: (s) => { this.strategy = s; this.showPrediction(); },
      selected: () => this.strategy,
    });
    for (const input of [this.nodes, this.procs]) input.addEventListener("input", () => this.replan());
  }

  // The states each command may be issued in, as the API's state machine has them (GET
  // /api/commands/), read once; until they arrive every command button stays disabled.
  async loadRules() {
    const { ok, data } = await api("/api/commands/");
    if (!ok) return;
    this.rules = data;
    this.enable(this.job.state());
  }

  allowed(kind, state) {
    return this.rules[kind]?.allowed_in.includes(state) ?? false;
  }

  enable(state) {
    for (const kind of Object.keys(LABEL)) {
      document.getElementById(kind).disabled = !this.allowed(kind, state) || this.held.has(kind);
    }
    // every button in a command's panel sends that command
    for (const kind of PANELS) {
      for (const button of document.querySelectorAll(`#${kind}-panel button`)) {
        button.disabled = !this.allowed(kind, state);
      }
    }
    document.getElementById("pause-warm").disabled = !this.allowed("pause", state);
  }

  click(kind) {
    if (PANELS.includes(kind)) {
      const panel = document.getElementById(`${kind}-panel`);
      panel.hidden = !panel.hidden;
      if (kind === "reshard" && !panel.hidden) this.replan();
      if (kind === "rebalance" && !panel.hidden) this.shares.value = this.job.shares().join(", ");
      return;
    }
    if (kind === "clone") return this.clone();
    return this.send(kind);
  }

  async send(kind, body, buttonId = kind) {
    const button = document.getElementById(buttonId);
    button.disabled = true;
    this.sending += 1;
    const { ok, status, data } = await api(`/api/jobs/${this.job.id}/${kind}/`, { method: "POST", body })
      .finally(() => { this.sending -= 1; });
    try {
      return this.sent(kind, ok, status, data);
    } finally {
      // the pushes that came while it was on its way, now that this page knows its command
      const early = [...this.early.values()];
      this.early.clear();
      this.applyCommands(early);
    }
  }

  sent(kind, ok, status, data) {
    if (!ok) {
      this.show(kind, `${LABEL[kind]} refused: ${errorText(data, status)}`, "refused");
      this.enable(this.job.state());
      return null;
    }
    const command = data?.kind ? data : null; // cancel of a queued job answers with the job
    const entry = this.entry(command?.id ?? `${kind}-${Date.now()}`, kind);
    const settled = ["done", "refused"].includes(command?.state);
    const text = kind === "cancel" ? "Cancel requested; the ranks stop within seconds."
      : settled ? `${LABEL[kind]} ${command.state}: ${describe(command.result)}`
        : `${LABEL[kind]} sent; waiting for the engine at the next step boundary…`;
    if (!command) {
      this.update(entry, "pending", text);
      return null;
    }
    const known = { id: String(command.id), kind, entry, ran: false };
    this.commands.set(known.id, known);
    if (HOLD.has(kind) && !settled) this.held.set(kind, known.id);
    if (settled) this.settle(known, command.state, text); else this.update(entry, command.state, text);
    this.acknowledgeSeen(known.id); // its action event may have come before this answer
    return command;
  }

  // The engine's word on a command that came before the page knew the command.
  acknowledgeSeen(id) {
    for (const event of this.job.actions()) {
      if (String(event.command) === id) this.acknowledge(event);
    }
  }

  // The API or the engine settled a command. A resume or reshard the engine has not run
  // since waits (`stepped` makes it done); a held button is given back.
  settle(known, state, text) {
    if (this.held.get(known.kind) === known.id) {
      this.held.delete(known.kind);
      this.enable(this.job.state());
    }
    if (state === "done" && RUNS_AGAIN.has(known.kind) && !known.ran) {
      known.doneText = text;
      this.update(known.entry, "waiting", `${text}; ${WAITING}`);
      return;
    }
    this.update(known.entry, state, text);
  }

  // A step event: the engine runs. Each resume or reshard settled and waiting for it has
  // taken effect (one not settled yet may still be ahead of the engine).
  stepped() {
    if (this.job.state() !== "running") return;
    for (const known of this.commands.values()) {
      if (known.entry.dataset.state !== "waiting") continue;
      known.ran = true;
      this.update(known.entry, "done", known.doneText);
    }
  }

  entry(id, kind) {
    const li = el("li", { dataset: { commandId: id, kind } });
    this.list.prepend(li);
    return li;
  }

  // An entry's state and text; the result line follows the newest entry (the list's first),
  // not whichever older command was settled last (a reload settles them all, oldest first).
  update(entry, state, text) {
    entry.dataset.state = state;
    entry.replaceChildren(el("strong", {}, label(entry.dataset.kind)),
                          " ", el("span", { class: `cmd-state cmd-${state}` }, state), " ", text);
    if (entry !== this.list.firstElementChild) return;
    this.resultEl.textContent = text;
    this.resultEl.dataset.kind = entry.dataset.kind;
    this.resultEl.dataset.state = state;
  }

  show(kind, text, state) {
    this.update(this.entry(`${kind}-${Date.now()}`, kind), state, text);
  }

  // An `action` event: the engine carried out (or refused) a command.
  acknowledge(event) {
    const known = this.commands.get(String(event.command));
    if (!known) return;
    const refused = event.action === ActionName.REFUSED;
    const text = refused ? `${label(known.kind)} refused by the engine: ${event.error}`
      : `${label(known.kind)} done at step ${event.step}${describe(event) ? `: ${describe(event)}` : ""}`;
    this.settle(known, refused ? "refused" : "done", text);
  }

  // Commands as the API has them (oldest first), pushed over the job's socket: all of them on
  // connecting, then each at every move of its state. One this page did not send (a reloaded
  // page, another client) gets its entry here; one it does not know while it is sending one
  // of its own waits for that POST's answer, as it may be that very command.
  applyCommands(commands) {
    for (const command of commands) {
      const id = String(command.id);
      if (!this.commands.has(id) && this.sending) {
        this.early.set(id, command);
        continue;
      }
      const adopted = !this.commands.has(id);
      if (adopted) this.adopt(command, command === commands.at(-1));
      this.apply(this.commands.get(id), command);
      if (adopted) this.acknowledgeSeen(id);
    }
  }

  apply(known, command) {
    // one settled and waiting for the engine to run keeps the engine's word over the API's
    if ([command.state, "waiting"].includes(known.entry.dataset.state)) return;
    if (command.state === "done" || command.state === "refused") {
      const detail = describe(command.result);
      this.settle(known, command.state,
        `${label(known.kind)} ${command.state}${detail ? `: ${detail}` : ""}`);
    } else if (command.state === "delivered" && ["new", "pending"].includes(known.entry.dataset.state)) {
      known.entry.dataset.state = "delivered"; // a push older than what the page knows moves nothing back
    }
  }

  // An entry for a command sent elsewhere, its state still to be read ("new"). Only the
  // job's newest command can still be waiting for the engine, while the job is coming back.
  adopt(command, newest) {
    const entry = this.entry(command.id, command.kind);
    entry.dataset.state = "new";
    entry.replaceChildren(el("strong", {}, label(command.kind)), ` ${command.state}`);
    const ran = !newest || !COMING_BACK.has(this.job.state());
    this.commands.set(String(command.id), { id: String(command.id), kind: command.kind, entry, ran });
  }

  // -- rollback: pick a checkpoint in the list or on the loss chart ----------------------------
  // `checkpoints` in the order to offer them: the live branch newest first, then the
  // abandoned branch (written before a rollback went back past them), labelled as such.
  setCheckpoints(checkpoints) {
    this.checkpoints = checkpoints;
    this.exports.show(checkpoints);
    this.evaluations.show(this.exports.checkpoints);
    const list = document.getElementById("checkpoint-list");
    if (!checkpoints.length) {
      list.replaceChildren(el("li", { class: "muted" }, "No checkpoint yet."));
      return;
    }
    list.replaceChildren(...checkpoints.map((c) => el("li", { dataset: { step: c.step, branch: c.branch ?? "live" } },
      el("label", { class: "inline" },
        el("input", { type: "radio", name: "checkpoint", value: c.step, checked: this.picked?.step === c.step,
                      disabled: gone(c), onchange: () => this.pick(c) }),
        ` step ${c.step}`, el("span", { class: "muted" },
          ` · ${c.tier || CheckpointTier.DISK} · ${bytes(c.size_bytes)} · ${c.strategy ?? ""} on ${c.world_size ?? "?"}`),
        c.branch === "abandoned"
          ? el("span", { class: "tag tag-abandoned" }, `abandoned branch${gone(c) ? " · deleted" : ""}`)
          : ""))));
  }

  pick(checkpoint) {
    this.picked = checkpoint;
    document.getElementById("rollback-panel").hidden = false;
    for (const radio of document.querySelectorAll("#checkpoint-list input")) {
      radio.checked = Number(radio.value) === checkpoint.step;
    }
    document.getElementById("rollback-picked").textContent = `checkpoint of step ${checkpoint.step}`;
  }

  async rollback() {
    if (!this.picked) {
      this.show("rollback", "Rollback: pick a checkpoint in the list or on the loss chart first.", "refused");
      return;
    }
    const skip = document.getElementById("rollback-skip").checked;
    const keep = document.getElementById("rollback-keep-settings").checked;
    // the API's checkpoint id when the list came from it; else the step (newest at or before)
    const target = this.picked.id !== undefined ? { checkpoint: this.picked.id } : { step: this.picked.step };
    await this.send("rollback", { ...target, skip_data: skip, keep_settings: keep });
  }

  // -- set: live settings, their effective values and history (as GET /settings/, pushed) ----
  showSettings(data) {
    const select = document.getElementById("set-key");
    if (!select.options.length) {
      select.replaceChildren(...Object.keys(data.effective).map((k) => el("option", { value: k }, k)));
    }
    document.getElementById("live-settings").replaceChildren(...Object.entries(data.effective)
      .map(([key, value]) => el("tr", { dataset: { key } }, el("td", {}, key),
                                el("td", {}, JSON.stringify(value)))));
    document.getElementById("settings-history").replaceChildren(...data.history.map((h) =>
      el("li", {}, `step ${h.step} · ${h.by}: ${changesText(h.changes)}`)));
  }

  async set() {
    const key = document.getElementById("set-key").value;
    const text = document.getElementById("set-value").value.trim();
    let value = text;
    try { value = JSON.parse(text); } catch { /* not JSON: sent as the string, which the API names */ }
    await this.send("set", { [key]: value });
  }

  // -- reshard: a layout, the planner's prediction for each strategy -----------------------
  // A reshard keeps the global batch: each of the new layout's ranks gets its share of it.
  replan() {
    const { spec } = this.job;
    const { preset, ...model } = spec.model ?? {};
    const defaults = SpecDefaults.train;
    const world = worldOf(spec.parallel);
    const newWorld = Number(this.nodes.value) * Number(this.procs.value);
    const microBatch = spec.train?.micro_batch ?? defaults.micro_batch;
    this.plan.update({
      preset: preset || "tiny", model: JSON.stringify(model),
      nodes: this.nodes.value, procs_per_node: this.procs.value,
      micro_batch: newWorld > 0 ? Math.max(1, Math.round((microBatch * world) / newWorld)) : microBatch,
      seq_len: spec.train?.seq_len ?? defaults.seq_len,
      grad_accum: spec.train?.grad_accum ?? defaults.grad_accum,
      collective: spec.parallel?.collective ?? SpecDefaults.parallel.collective,
    });
  }

  showPrediction() {
    const p = this.plan.prediction(this.strategy);
    document.getElementById("reshard-picked").textContent = p
      ? `${p.strategy}: ${bytes(p.memory_bytes.total)} per device, ${duration(p.step_time_s)} per step (predicted)`
      : this.strategy;
  }

  async reshard() {
    await this.send("reshard", { strategy: this.strategy, nodes: Number(this.nodes.value),
                                 procs_per_node: Number(this.procs.value) });
  }

  // The launch form, filled from this job's spec, to change before launching a new job
  clone() {
    window.location.assign(`/jobs/new/?clone=${this.job.id}`);
  }
}

// The job page: a websocket snapshot, then live events update every panel (no polling). The
// commands, checkpoints and live settings come over the same socket when they change, and the
// state changes with their hosts and history, so nothing is read again from the API when a
// message arrives (only the metric series, after a rollback or a zoom). On a dropped
// connection it reconnects with `?after=<last seq>` and receives exactly what it missed.
import { api } from "./api.js";
import { Controls } from "./controls.js";
import { duration, el, fieldsText, sharesText, where } from "./format.js";
import { Goodput } from "./goodput.js";
import { MetricCharts } from "./metrics.js";
import { Proposals } from "./proposals.js";
import { SharesChart } from "./shares.js";
import { Telemetry } from "./telemetry.js";
import { ActionName, CheckpointTier } from "./vocabulary.js";

const root = document.getElementById("job");
const jobId = root.dataset.jobId;
const totalSteps = Number(root.dataset.totalSteps);
const spec = JSON.parse(document.getElementById("job-spec").textContent);
const FINAL = new Set(["completed", "failed", "cancelled"]);
const FEED_KEEP = 300;
const $ = (id) => document.getElementById(id);

let state = $("state").dataset.state;
// a warm pause is its own state (the ranks idle in memory, the worker held)
const STATE_LABEL = { paused_warm: "paused (warm)", waiting_for_hosts: "waiting for hosts" };
let lastSeq = null; // newest event received; null until the snapshot
let startedAt = root.dataset.startedAt ? Date.parse(root.dataset.startedAt) : null;
let finishedAt = root.dataset.finishedAt ? Date.parse(root.dataset.finishedAt) : null;
let step = Number($("step").textContent);
const rate = []; // [engine time (s), step] of recent step events, for the ETA

// What the markers and the feed show, each list in sequence order, unique by seq.
const marks = { anomalies: [], actions: [], checkpoints: [], memberships: [], bad_batches: [] };
function remember(kind, event) {
  const list = marks[kind];
  if (event.seq !== undefined && list.some((e) => e.seq === event.seq)) return false;
  list.push(event);
  return true;
}

const controls = new Controls({ id: jobId, spec, state: () => state, actions: () => marks.actions,
                                shares: () => shares.current() });
const charts = new MetricCharts(jobId, {
  markers: () => marks,
  // a step's marker may stand for several checkpoints of it: pick the one the list offers
  onPickCheckpoint: (c) => controls.pick(
    controls.checkpoints.find((shown) => shown.step === c.step) ?? checkpointWithId(c)),
});
const telemetry = new Telemetry({ layoutAt });
const shares = new SharesChart({ spec, events: () => marks, newestStep: () => step });
const goodput = new Goodput(jobId);
const proposals = new Proposals(jobId, JSON.parse(document.getElementById("ladder-actions").textContent));
let checkpointRows = new Map(); // event seq -> the API's checkpoint row (its id, branch)
let transitions = []; // the state history of the job: the API's, then each change pushed

// The layout a step ran on: the spec's until the first reshard before it, then that one's.
function layoutAt(step) {
  const reshards = marks.actions.filter((a) => a.action === ActionName.RESHARD && a.parallel && a.step < step);
  return reshards.at(-1)?.parallel ?? spec.parallel ?? {};
}

function checkpointWithId(c) {
  return { ...c, ...(checkpointRows.get(c.seq) ?? {}) };
}

// Of two checkpoints of one step, the one to show: the live branch's (a step trained again
// after a rollback is checkpointed again), then a disk one over the memory tier's, then the
// newer. One the API has not listed yet was just written: on the live branch.
const abandoned = (c) => c.branch === "abandoned";
function better(a, b) {
  if (abandoned(a) !== abandoned(b)) return !abandoned(a);
  const onDisk = (c) => (c.tier || CheckpointTier.DISK) === CheckpointTier.DISK;
  if (onDisk(a) !== onDisk(b)) return onDisk(a);
  return a.seq > b.seq;
}

// the rollback list: one checkpoint per step, the live branch newest first and then the
// abandoned one (shown as the run's history even once the engine deleted it). Retention
// deletes the oldest first, so a live one the API finds missing but newer than every one on
// disk is still being written, not gone; an older missing one leaves the list.
function showCheckpoints() {
  const shown = new Map();
  for (const c of marks.checkpoints.map(checkpointWithId)) {
    if (!shown.has(c.step) || better(c, shown.get(c.step))) shown.set(c.step, c);
  }
  const all = [...shown.values()];
  const lastOnDisk = Math.max(-1, ...all.filter((c) => c.available === true).map((c) => c.step));
  const kept = all.filter((c) => c.available !== false || abandoned(c) || c.step > lastOnDisk);
  controls.setCheckpoints(kept.sort((a, b) => abandoned(a) - abandoned(b) || b.step - a.step));
}

// -- progress ------------------------------------------------------------------------------
function showProgress() {
  $("step").textContent = step;
  const share = totalSteps ? Math.min(1, step / totalSteps) : 0;
  $("progress-bar").style.width = `${(share * 100).toFixed(1)}%`;
  const end = finishedAt ?? Date.now();
  $("elapsed").textContent = startedAt ? duration((end - startedAt) / 1000) : "–";
  let eta = "–";
  if (!FINAL.has(state) && rate.length >= 2) {
    const [t0, s0] = rate[0], [t1, s1] = rate.at(-1);
    if (s1 > s0 && t1 > t0) eta = duration(((totalSteps - step) * (t1 - t0)) / (s1 - s0));
  } else if (state === "completed") {
    eta = "done"; // a failed or cancelled job has no end to wait for: "–"
  }
  $("eta").textContent = eta;
}
setInterval(showProgress, 1000); // the elapsed clock; nothing is fetched

// -- state, history, feed ------------------------------------------------------------------
function showState(next, error) {
  state = next;
  $("state").textContent = STATE_LABEL[next] ?? next;
  $("state").dataset.state = next;
  $("state").className = `state state-${next}`;
  controls.enable(next);
  if (FINAL.has(next)) { $("live").textContent = "finished"; finishedAt ??= Date.now(); }
  if (error) { $("error").textContent = error; $("error").hidden = false; }
}

// Where and since when the job runs, from its detail (read once) or a `job` message.
function showWhereabouts(job) {
  startedAt = job.started_at ? Date.parse(job.started_at) : startedAt;
  finishedAt = job.finished_at ? Date.parse(job.finished_at) : finishedAt;
  $("where").textContent = where(job, true);
}

async function loadDetail() {
  const { ok, data } = await api(`/api/jobs/${jobId}/`);
  if (!ok) return;
  showWhereabouts(data);
  for (const t of data.transitions ?? []) addTransition(t);
}

// A state change, once: the detail and a (re)connect's `job` message may both bring it.
function addTransition(change) {
  const same = (t) => t.to_state === change.to_state && Date.parse(t.time) === Date.parse(change.time);
  if (transitions.some(same)) return;
  transitions.push(change);
  transitions.sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
  showHistory();
}

// A rollback's note names its checkpoint by the API's id; a person knows it by its step.
function withSteps(message) {
  const steps = new Map([...checkpointRows.values()].map((c) => [String(c.id), c.step]));
  return message.replace(/checkpoint (\d+)/g, (text, id) =>
    (steps.has(id) ? `checkpoint of step ${steps.get(id)}` : text));
}

function showHistory() {
  $("history").replaceChildren(...transitions.map((t) => el("tr", {},
    el("td", {}, new Date(t.time).toLocaleTimeString()),
    el("td", {}, `${t.from_state} → `, el("strong", {}, t.to_state)),
    el("td", {}, [t.cause, t.actor].filter(Boolean).join(" · ")),
    el("td", { class: "muted" }, withSteps(t.message)))));
}

// The checkpoints as the API lists them (their ids, availability and branch), pushed.
function onCheckpoints(message) {
  checkpointRows = new Map(message.checkpoints.map((c) => [c.seq, c]));
  showCheckpoints();
  showHistory();
}


function feedItem(kind, e) {
  const text = {
    anomaly: () => [`${e.kind} (${e.severity})`,
                    e.rank !== null && e.rank !== undefined ? `rank ${e.rank}` : "",
                    fieldsText(e.evidence)],
    action: () => [e.action, e.anomaly ? `for ${e.anomaly}` : "", e.by ? `by ${e.by}` : "",
                   e.reason ?? "", e.error ?? "", sharesText(e.shares),
                   e.cause ? `cause: the ${e.cause}` : ""],
    membership: () => [`hosts ${e.hosts_before.join(", ")} → ${e.hosts_after.join(", ")}`,
                       `${e.world_size} ranks`, e.reason],
    // a batch the rerun found bad and skipped: where it is in the data
    bad_batch: () => [`for ${e.anomaly}`, `rank ${e.ranks.join(", ")}`,
                      `samples ${e.samples.join(", ")}`, `dataset windows ${e.windows.join(", ")}`],
  }[kind]();
  const tag = { anomaly: e.kind, action: e.action, membership: "membership",
                bad_batch: "bad_batch" }[kind];
  return el("li", { class: `feed-${kind}`, dataset: { kind: tag, step: e.step, seq: e.seq } },
    el("span", { class: "feed-step" }, `step ${e.step}`), " ",
    el("span", { class: `tag tag-${kind}` }, kind), " ", text.filter(Boolean).join(" · "));
}

// Newest step first, and within a step the newest event: the order does not depend on
// whether anomalies and actions arrived interleaved (live) or one kind after the other (the
// snapshot), nor on a rollback that trained steps again.
function addFeed(kind, event) {
  const feed = $("feed");
  feed.querySelector(".empty")?.remove();
  const later = (li) => Number(li.dataset.step) > event.step
    || (Number(li.dataset.step) === event.step && Number(li.dataset.seq) > event.seq);
  const before = [...feed.children].find((li) => !later(li));
  feed.insertBefore(feedItem(kind, event), before ?? null);
  while (feed.children.length > FEED_KEEP) feed.lastChild.remove();
}

// -- events ----------------------------------------------------------------------------------
function onStep(event) {
  charts.add(event);
  step = event.step; // events arrive in order; after a rollback this goes back, as the run did
  rate.push([event.time, event.step]);
  if (rate.length > 30) rate.shift();
  showProgress();
  shares.update(); // its lines reach the newest step
  controls.stepped();
  // how many steps arrived live (after the snapshot): what the browser tests look for
  root.dataset.liveSteps = Number(root.dataset.liveSteps ?? 0) + 1;
}

// `live`: an event as it happens, not one of the snapshot's (whose series are current).
function onMark(kind, event, live = true) {
  const key = { anomaly: "anomalies", action: "actions", checkpoint: "checkpoints",
                membership: "memberships", bad_batch: "bad_batches" }[kind];
  if (!remember(key, event)) return;
  if (kind !== "checkpoint") addFeed(kind, event);
  if (live && ["action", "membership"].includes(kind)) shares.update();
  if (live) charts.redrawMarkers(); // the snapshot's are drawn with its series, once
  if (kind === "action" && live) {
    controls.acknowledge(event);
    // a rollback replaced steps: the stored series now hold the values trained again (the
    // checkpoints past its target, now the abandoned branch, come pushed after it)
    if (event.action === ActionName.ROLLBACK) { charts.refetch(); telemetry.rollback(event.to_step); }
  }
  if (kind === "checkpoint") showCheckpoints();
}

function onSnapshot(message) {
  performance.mark("snapshot-received"); // where a page load's time goes (test_large_run.py)
  for (const key of Object.keys(marks)) marks[key] = [];
  $("feed").replaceChildren(el("li", { class: "empty muted" }, "No anomaly or action yet."));
  for (const e of message.anomalies ?? []) onMark("anomaly", e, false);
  for (const e of message.actions ?? []) onMark("action", e, false);
  for (const e of message.memberships ?? []) onMark("membership", e, false);
  for (const e of message.bad_batches ?? []) onMark("bad_batch", e, false);
  for (const e of message.checkpoints ?? []) remember("checkpoints", e);
  for (const e of message.proposals ?? []) proposals.add(e);
  charts.load(message.series);
  telemetry.addOps(message.ops_history ?? []);
  telemetry.addExperts(message.experts_history ?? []);
  goodput.show(message.goodput);
  if (FINAL.has(message.state) && !message.ops_history?.length) {
    telemetry.placeholders("not measured on this run");
  }
  const job = message.job ?? {};
  if (job.started_at) startedAt = Date.parse(job.started_at);
  step = job.step ?? step;
  showState(job.state ?? message.state, job.error);
  showProgress();
  shares.update();
  showCheckpoints();
  performance.mark("snapshot-shown");
}

function onMessage(message) {
  if (message.type !== "job" && typeof message.seq === "number") {
    lastSeq = Math.max(lastSeq ?? 0, message.seq);
    root.dataset.seq = lastSeq; // the newest event this page holds: what the tests wait for
  }
  switch (message.type) {
    case "snapshot": onSnapshot(message); break;
    case "step": onStep(message); break;
    case "ops": telemetry.addOps(message); break;
    case "experts": telemetry.addExperts(message); break;
    case "goodput": goodput.show(message.goodput); break;
    case "proposal": proposals.add(message); break;
    // the Commands card: every command of the job on (re)connecting, then each as it moves
    case "commands": controls.applyCommands(message.commands); break;
    case "command": controls.applyCommands([message.command]); break;
    case "checkpoints": onCheckpoints(message); break;
    case "settings": controls.showSettings(message); break;
    case "evaluation": controls.evaluations.pushed(message.evaluation); break;
    case "anomaly": case "action": case "checkpoint": case "membership": case "bad_batch":
      onMark(message.type, message);
      break;
    case "job":
      showState(message.state, message.error);
      showWhereabouts(message);
      if (message.from_state) addTransition({ ...message, to_state: message.state });
      // after a reshard or resume the engine starts anew: its first steps set a new pace
      if (["queued", "paused", "paused_warm"].includes(message.state)) rate.length = 0;
      break;
    default: break;
  }
}

let retry = 500;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const after = lastSeq === null ? "" : `?after=${lastSeq}`;
  const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/${after}`);
  socket.onopen = () => { retry = 500; $("live").textContent = FINAL.has(state) ? "finished" : "live"; };
  socket.onmessage = ({ data }) => onMessage(JSON.parse(data));
  socket.onclose = (event) => {
    if (event.code === 4401 || event.code === 4404) {
      $("live").textContent = "not allowed to watch this job";
    } else if (!FINAL.has(state)) {
      // the server restarted or the network dropped: reconnect after the last seq received
      $("live").textContent = "reconnecting…";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    } else {
      $("live").textContent = "finished";
    }
  };
}

controls.enable(state);
controls.loadRules();
showProgress();
loadDetail();
connect();

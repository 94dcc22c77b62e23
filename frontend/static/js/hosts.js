// The Hosts page: a row per host from `/ws/hosts/` (a snapshot, then a record per changed
// host), its beat's age ticking here against the server's clock (a host that stops beating
// sends nothing: the page turns it lost after `lost_after_s`), drain/undrain for staff.
import { api } from "./api.js";
import { bytes, duration, el, errorText } from "./format.js";

const table = document.getElementById("hosts");
const body = document.getElementById("host-rows");
const staff = table.dataset.staff === "1";
const hosts = new Map(); // name -> the host's record
let lostAfter = 30;
let skew = 0; // server clock - this browser's, in ms

function devices(host) {
  const cpu = host.devices.cpu ?? {};
  const gpus = host.devices.gpus ?? [];
  const parts = [`${cpu.cores ?? "?"} cores, ${bytes(cpu.memory_bytes)}`];
  if (gpus.length) parts.push(gpus.map((g) => `${g.name} (${bytes(g.memory_bytes)})`).join(", "));
  return parts.join("; ");
}

function ageOf(host) {
  return (Date.now() + skew - Date.parse(host.beat_at)) / 1000;
}

function stateOf(host) {
  if (ageOf(host) > lostAfter) return "lost";
  return host.drained ? "drained" : "up";
}

function jobs(host) {
  if (!host.jobs.length) return "–";
  // another user's job comes without its id (null) to a user who is not staff: its name
  // says so, and there is no page to link
  return host.jobs.map((j) => el("div", {},
    j.job === null ? el("span", { class: "muted" }, j.name) : el("a", { href: `/jobs/${j.job}/` }, `#${j.job} ${j.name}`),
    el("span", { class: "muted" }, ` slots ${j.slots.join(",")}`)));
}

function drainButton(host) {
  if (!staff) return null;
  const drain = !host.drained;
  return el("button", { type: "button", class: "button", onclick: () => setDrained(host.name, drain) },
    drain ? "Drain" : "Undrain");
}

function row(host) {
  const version = el("span", { title: host.version_differs ? "differs from this server's" : "" },
    host.version, host.version_differs ? " ⚠" : "");
  return el("tr", { dataset: { host: host.name } },
    el("td", { class: "name" }, host.name),
    el("td", {}, host.address),
    el("td", {}, devices(host)),
    el("td", { class: "num" }, `${host.slots_used} / ${host.slots_free}`),
    el("td", {}, jobs(host)),
    el("td", { class: "age num" }),
    el("td", {}, el("span", { class: "state" })),
    el("td", { class: host.version_differs ? "warn" : "" }, version),
    el("td", { class: "num" }, `${host.clock_offset_s.toFixed(3)} s`),
    el("td", {}, drainButton(host)));
}

function tick(tr, host) {
  tr.querySelector(".age").textContent = `${duration(Math.max(ageOf(host), 0))} ago`;
  const state = stateOf(host);
  const badge = tr.querySelector(".state");
  badge.className = `state host-${state}`;
  badge.textContent = state;
}

function show(host) {
  hosts.set(host.name, host);
  const tr = row(host);
  const old = body.querySelector(`tr[data-host="${CSS.escape(host.name)}"]`);
  if (old) old.replaceWith(tr);
  else {
    const after = [...body.children].find((r) => r.dataset.host > host.name);
    body.insertBefore(tr, after ?? null);
  }
  tick(tr, host);
  document.getElementById("no-hosts").hidden = hosts.size > 0;
}

async function setDrained(name, drained) {
  const { ok, status, data } = await api(`/api/hosts/${encodeURIComponent(name)}/${drained ? "drain" : "undrain"}/`,
    { method: "POST" });
  const error = document.getElementById("host-error");
  error.hidden = ok;
  if (ok) show(data);
  else error.textContent = errorText(data, status);
}

let retry = 500;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/hosts/`);
  socket.onopen = () => { retry = 500; };
  socket.onmessage = ({ data }) => {
    const message = JSON.parse(data);
    if (message.now) skew = Date.parse(message.now) - Date.now();
    if (message.type === "snapshot") {
      lostAfter = message.lost_after_s;
      document.getElementById("lost-after").textContent = duration(lostAfter);
      hosts.clear();
      body.replaceChildren();
      message.hosts.forEach(show);
      document.getElementById("no-hosts").hidden = hosts.size > 0;
    } else if (message.type === "host") show(message.host);
  };
  socket.onclose = (event) => {
    if (event.code === 4401) return;
    setTimeout(connect, retry);
    retry = Math.min(retry * 2, 10000);
  };
}

setInterval(() => {
  for (const tr of body.children) tick(tr, hosts.get(tr.dataset.host));
}, 1000);
connect();

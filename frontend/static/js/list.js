// The job list: state changes arrive over `/ws/jobs/` and update the rows in place; a job
// launched elsewhere (another tab, the API) gets a row when it first changes state.
import { el } from "./format.js";

const body = document.getElementById("job-rows");

function label(state) {
  const text = state.replaceAll("_", " ");
  return text[0].toUpperCase() + text.slice(1);
}

function row(job) {
  let tr = body.querySelector(`tr[data-job-id="${job.job ?? job.id}"]`);
  if (!tr) {
    const id = job.job ?? job.id;
    tr = el("tr", { dataset: { jobId: id } },
      el("td", {}, id), el("td", {}, el("a", { href: `/jobs/${id}/` }, job.name)),
      el("td", {}, el("span", { class: "state" })), el("td", { class: "step" }),
      el("td", {}, job.owner ?? ""), el("td", {}, job.time ? new Date(job.time).toLocaleString() : ""));
    body.prepend(tr);
    body.closest("table").hidden = false;
    document.getElementById("no-jobs")?.remove();
  }
  return tr;
}

function show(job) {
  const tr = row(job);
  const badge = tr.querySelector(".state");
  badge.className = `state state-${job.state}`;
  badge.textContent = label(job.state);
  tr.querySelector(".step").textContent = `${job.step} / ${job.total_steps}`;
}

let retry = 500;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/`);
  socket.onopen = () => { retry = 500; };
  socket.onmessage = ({ data }) => {
    const message = JSON.parse(data);
    if (message.type === "snapshot") {
      for (const job of message.jobs) {
        if (body.querySelector(`tr[data-job-id="${job.id}"]`)) show(job);
      }
    } else if (message.type === "job") {
      show(message);
    }
  };
  socket.onclose = (event) => {
    if (event.code === 4401) return;
    setTimeout(connect, retry); // the snapshot on reconnect brings the rows up to date
    retry = Math.min(retry * 2, 10000);
  };
}
connect();

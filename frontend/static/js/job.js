// The job page: a websocket snapshot, then live events extend the charts (no polling).
import { api } from "./api.js";

const root = document.getElementById("job");
const jobId = root.dataset.jobId;
const CHARTS = {
  loss: { title: "Loss", color: "#2563eb" },
  tokens_per_s: { title: "Throughput (tokens/s)", color: "#059669" },
};
const FINAL = new Set(["completed", "failed", "cancelled"]);
const stateEl = document.getElementById("state");
const stepEl = document.getElementById("step");
const liveEl = document.getElementById("live");
const errorEl = document.getElementById("error");
const cancelButton = document.getElementById("cancel");
let state = stateEl.textContent.trim();

function drawCharts(series) {
  for (const [name, { title, color }] of Object.entries(CHARTS)) {
    const s = series[name] ?? { step: [], value: [] };
    Plotly.newPlot(
      `chart-${name}`,
      [{ x: s.step, y: s.value, mode: "lines+markers", marker: { size: 4 }, line: { color } }],
      {
        title: { text: title, font: { size: 14 } },
        margin: { l: 60, r: 20, t: 40, b: 40 },
        xaxis: { title: { text: "step" } },
        height: 320,
      },
      { responsive: true, displaylogo: false },
    );
  }
}

function addStep(event) {
  for (const name of Object.keys(CHARTS)) {
    const value = event[name];
    if (value === undefined) continue;
    Plotly.extendTraces(`chart-${name}`, { x: [[event.step]], y: [[typeof value === "number" ? value : null]] }, [0]);
  }
  stepEl.textContent = event.step;
  // how many steps arrived live (after the snapshot): what the browser tests look for
  root.dataset.liveSteps = Number(root.dataset.liveSteps ?? 0) + 1;
}

function showState(next, error) {
  state = next;
  stateEl.textContent = next;
  stateEl.className = `state state-${next}`;
  cancelButton.disabled = FINAL.has(next);
  if (FINAL.has(next)) liveEl.textContent = "finished";
  if (error) {
    errorEl.textContent = error;
    errorEl.hidden = false;
  }
}

let retry = 500;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/`);
  socket.onopen = () => { retry = 500; liveEl.textContent = FINAL.has(state) ? "finished" : "live"; };
  socket.onmessage = ({ data }) => {
    const message = JSON.parse(data);
    if (message.type === "snapshot") {
      drawCharts(message.series);
      showState(message.job.state, message.job.error);
      stepEl.textContent = message.job.step;
    } else if (message.type === "step") {
      addStep(message);
    } else if (message.type === "job") {
      showState(message.state, message.error);
    }
  };
  socket.onclose = (event) => {
    if (event.code === 4401 || event.code === 4404) {
      liveEl.textContent = "not allowed to watch this job";
    } else if (!FINAL.has(state)) {
      // the server restarted or the network dropped: reconnect; the snapshot fills the gap
      liveEl.textContent = "reconnecting…";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    } else {
      liveEl.textContent = "finished";
    }
  };
}

cancelButton.disabled = FINAL.has(state);
cancelButton.addEventListener("click", async () => {
  cancelButton.disabled = true;
  const { ok, data } = await api(`/api/jobs/${jobId}/cancel/`, { method: "POST" });
  document.getElementById("action-result").textContent = ok
    ? "Cancel requested; the ranks stop within seconds."
    : `Refused: ${data?.detail ?? "unknown error"}`;
  if (!ok) cancelButton.disabled = FINAL.has(state);
});

connect();

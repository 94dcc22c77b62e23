// The job page's exports: an Export button per disk checkpoint; a worker writes the Hugging Face
// model folder, and the row shows the export's state, then its folder (or the error). Only an
// export under way is followed, by GET on its URL once a second. Each row opens to the
// checkpoint's lineage (lineage.js).
import { api } from "./api.js";
import { el, errorText } from "./format.js";
import { lineageRow } from "./lineage.js";
import { CheckpointTier } from "./vocabulary.js";

const UNDER_WAY = new Set(["pending", "running"]);
const FOLLOW_MS = 1000;

export class Exports {
  // `more(checkpoint)`: other buttons for its row (Evaluate)
  constructor(jobId, list, more = () => "") {
    this.jobId = jobId;
    this.list = list;
    this.more = more;
    this.checkpoints = [];
    this.known = new Map(); // checkpoint id -> its export record (or a refusal)
  }

  url(checkpoint) {
    return `/api/jobs/${this.jobId}/checkpoints/${checkpoint.id}/export/`;
  }

  // The checkpoints as the API lists them (with ids and their exports), in the order to show.
  show(checkpoints) {
    this.checkpoints = checkpoints.filter((c) => c.id !== undefined && c.available !== false
                                              && (c.tier || CheckpointTier.DISK) === CheckpointTier.DISK);
    for (const c of this.checkpoints) {
      if (c.export && !this.known.has(c.id)) this.remember(c, c.export);
    }
    if (!this.checkpoints.length) {
      this.list.replaceChildren(el("li", { class: "muted" }, "No disk checkpoint yet."));
      return;
    }
    this.list.replaceChildren(...this.checkpoints.map((c) => this.row(c)));
  }

  row(checkpoint) {
    const record = this.known.get(checkpoint.id);
    const busy = record && UNDER_WAY.has(record.state);
    const detail = record?.state === "done" ? record.out_dir : record?.error;
    return el("li", { dataset: { checkpointId: checkpoint.id, exportState: record?.state ?? "" } },
      `step ${checkpoint.step} `,
      el("button", { class: "export", disabled: busy, onclick: () => this.start(checkpoint) }, "Export"),
      " ", this.more(checkpoint),
      record ? el("span", { class: `export-state export-${record.state}` },
                  ` ${record.state}${detail ? `: ${detail}` : ""}`) : "",
      lineageRow(checkpoint));
  }

  remember(checkpoint, record) {
    this.known.set(checkpoint.id, record);
    if (UNDER_WAY.has(record.state)) setTimeout(() => this.follow(checkpoint), FOLLOW_MS);
  }

  async start(checkpoint) {
    const { ok, status, data } = await api(this.url(checkpoint), { method: "POST" });
    this.remember(checkpoint, ok ? data : { state: "refused", error: errorText(data, status) });
    this.show(this.checkpoints);
  }

  async follow(checkpoint) {
    const { ok, data } = await api(this.url(checkpoint));
    if (!ok) return;
    this.remember(checkpoint, data);
    this.show(this.checkpoints);
  }
}

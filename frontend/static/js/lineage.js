// A checkpoint's lineage on the job page: a "lineage" row under the checkpoint that opens to
// what made it (code, spec, data, tokens per source) and the checkpoints it came from, read
// once from GET /api/checkpoints/<id>/lineage/ when first opened. The checkpoint list is drawn
// again on every event, so the rows opened and what they read outlive a redraw.
import { api } from "./api.js";
import { el, errorText } from "./format.js";

const read = new Map(); // checkpoint id -> the lineage answer, or an error line
const opened = new Set(); // checkpoint ids whose row is open

const short = (hash) => (hash ? hash.slice(0, 12) : "none");

function parentText(p) {
  const where = p.checkpoint !== null
    ? `checkpoint ${p.checkpoint} of job ${p.job}` : p.path;
  return `${p.kind} from ${where}${p.step !== null ? ` (step ${p.step})` : ""}`;
}

function body(answer) {
  if (typeof answer === "string") return [el("p", { class: "muted" }, answer)];
  const { lineage, parents } = answer;
  if (!lineage) return [el("p", { class: "muted" }, "Not recorded: saved before lineages.")];
  return [
    el("ul", { class: "lineage-facts" },
      el("li", {}, `code ${lineage.code_version}`),
      el("li", {}, `spec sha256 ${short(lineage.spec_sha256)}`),
      ...lineage.sources.map((s) => el("li", { dataset: { source: s.name } },
        `${s.name}: ${s.tokens.toLocaleString()} tokens · manifest ${short(s.manifest_sha256)}`
        + ` · tokenizer ${short(s.tokenizer_sha256)}`))),
    parents.length
      ? el("ol", { class: "lineage-parents" }, ...parents.map((p) =>
        el("li", { dataset: { kind: p.kind } }, parentText(p))))
      : el("p", { class: "muted" }, "No parent: trained from scratch."),
  ];
}

// The expandable row for one checkpoint of the API's list (it has an id).
export function lineageRow(checkpoint) {
  const id = checkpoint.id;
  const details = el("details", { class: "lineage", open: opened.has(id) },
    el("summary", {}, "lineage"));
  const fill = () => details.replaceChildren(details.firstChild, ...body(read.get(id)));
  details.addEventListener("toggle", async () => {
    if (!details.open) { opened.delete(id); return; }
    opened.add(id);
    if (!read.has(id)) {
      const { ok, status, data } = await api(`/api/checkpoints/${id}/lineage/`);
      read.set(id, ok ? data : errorText(data, status));
    }
    fill();
  });
  if (read.has(id)) fill();
  return details;
}

// Number and time formatting shared by the pages.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  let i = 0;
  while (Math.abs(n) >= 1024 && i < UNITS.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${UNITS[i]}`;
}

export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  if (seconds < 1) return `${(seconds * 1000).toFixed(0)} ms`;
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

export function num(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (Array.isArray(x)) return x.map((v) => num(v, digits)).join(", ");
  if (typeof x === "object") return fieldsText(x, digits);
  if (typeof x !== "number") return String(x);
  if (x !== 0 && (Math.abs(x) >= 1e5 || Math.abs(x) < 1e-3)) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}

// An anomaly's evidence (or any flat record): "z 4.2, mean 3.1, ranks [0, 1]"
export function fieldsText(record, digits = 4) {
  return Object.entries(record ?? {})
    .map(([k, v]) => (v !== null && typeof v === "object" ? `${k} [${num(v, digits)}]`
                                                           : `${k} ${num(v, digits)}`))
    .join(", ");
}

// A rebalance's shares of the step's batch, samples per rank: "shares 10, 10, 10, 2" ("" for
// none)
export function sharesText(shares) {
  return Array.isArray(shares) ? `shares ${shares.join(", ")}` : "";
}

// An element with text, built without innerHTML so event data can never become markup.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// A REST list answer, paginated ({results: [...]}) or not.
export function rows(data) {
  if (Array.isArray(data)) return data;
  return Array.isArray(data?.results) ? data.results : [];
}

// The first message of a 400 answer: `{errors: {field: msg}}`, DRF's `{field: [msg]}` or `{detail}`.
export function errorText(data, status) {
  if (!data) return `the server answered ${status}`;
  if (data.detail) return String(data.detail);
  const errors = data.errors ?? data;
  const parts = Object.entries(errors).map(([field, msg]) =>
    `${field}: ${Array.isArray(msg) ? msg.join(" ") : typeof msg === "object" ? JSON.stringify(msg) : msg}`);
  return parts.join("; ") || `the server answered ${status}`;
}

// Where a job runs (its hosts, lead first, with the slots it holds on each), or why it waits
// for them; "" when neither applies (a finished job holds no hosts).
export function where(job, slots = false) {
  if (job.placement?.length) {
    return `on ${job.placement.map((p) => (slots ? `${p.host} [slots ${p.slots.join(", ")}]` : p.host))
      .join(", ")}`;
  }
  return job.waiting_reason ?? "";
}

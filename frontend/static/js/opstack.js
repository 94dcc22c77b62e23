// One step's time split into ops that do not overlap, so that a stack of them adds up to the
// step. Timed ops nest (engine/xputimer: a span opened inside another): the loop's
// `forward_backward` holds `forward` and `backward` and the collectives between them;
// `forward` holds the model's modules, timed by qualified name, and a module holds its
// submodules (`layers.3.attention` holds `layers.3.attention.key_norm`). Collectives and the
// data wait hold no other op. So the stack has every collective, the data wait, each
// module's own time (less its submodules'), forward's own time (less its modules'),
// backward and host ops (the checkpoint copy), and "other compute": the rest of each rank's
// compute (its step less collectives and data), which is the optimizer's update, the loop
// phases' own time and what no timer covers. Times are means over ranks, so they add up.

const PHASES = new Set(["forward_backward", "forward", "backward", "optimizer"]);
export const OTHER = "other compute";

function isModule(name, op) {
  return (op.kind === "compute" || op.kind === "matmul") && !PHASES.has(name);
}

// `layers.3.ffn.router` and `mtp.0.block.ffn.router` are both `ffn.router`: one bar per
// kind of module, not one per layer.
function role(name) {
  return name.replace(/^(layers|mtp)\.\d+\.(block\.)?/, "");
}

// The nearest enclosing module of each module (by name prefix), or null for a top one.
function parents(modules) {
  const byLength = [...modules].sort((a, b) => b.length - a.length);
  return new Map(modules.map((name) => [name,
    byLength.find((other) => other !== name && name.startsWith(`${other}.`)) ?? null]));
}

function meanCompute(event) {
  const ranks = event.ranks ?? [];
  if (!ranks.length) return (event.step_ms ?? 0) * (1 - (event.void_share ?? 0));
  return ranks.reduce((sum, r) => sum + (r.compute_ms ?? 0), 0) / ranks.length;
}

// {name: ms} of one `ops` event; the names are collective and phase names, module roles
// and OTHER.
export function stackOf(event) {
  const ops = event.ops ?? {};
  const total = (name) => ops[name]?.total_ms ?? 0;
  const out = {};
  const add = (name, ms) => { out[name] = (out[name] ?? 0) + Math.max(0, ms); };
  const modules = Object.keys(ops).filter((name) => isModule(name, ops[name]));
  const parent = parents(modules);
  const own = new Map(modules.map((name) => [name, total(name)]));
  let forwardOwn = total("forward");
  for (const name of modules) {
    const p = parent.get(name);
    if (p === null) forwardOwn -= total(name);
    else own.set(p, own.get(p) - total(name));
  }
  for (const name of modules) add(role(name), own.get(name));
  if (ops.forward) add("forward", forwardOwn);
  if (ops.backward) add("backward", total("backward"));
  let stacked = Object.values(out).reduce((a, b) => a + b, 0);
  for (const [name, op] of Object.entries(ops)) {
    if (op.kind === "collective" || op.kind === "data") add(name, op.total_ms ?? 0);
    else if (op.kind === "host") { add(name, op.total_ms ?? 0); stacked += op.total_ms ?? 0; }
  }
  add(OTHER, meanCompute(event) - stacked);
  return out;
}

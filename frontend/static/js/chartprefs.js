// How a person likes the step-metric charts drawn: EMA smoothing, log scale, and the x-axis
// (step, training time or tokens seen). Kept in this browser's localStorage, so the choice
// follows the person from job to job (per user on one browser; nothing is sent anywhere).

const KEY = "ringside.chart-options";
export const DEFAULTS = Object.freeze({ smoothing: 0, log: false, x: "step" });
export const X_TITLES = { step: "step", time: "training time (s)", tokens: "tokens seen" };

export function loadPrefs() {
  try {
    const stored = JSON.parse(localStorage.getItem(KEY) ?? "{}");
    return {
      smoothing: Math.min(0.99, Math.max(0, Number(stored.smoothing) || 0)),
      log: stored.log === true,
      x: Object.hasOwn(X_TITLES, stored.x) ? stored.x : DEFAULTS.x,
    };
  } catch {
    return { ...DEFAULTS }; // storage off or a value from an older page: the defaults
  }
}

// The options form (`#opt-smoothing`, `#opt-log`, `#opt-x`) shows the stored choice and
// stores every change; `onChange(prefs)` redraws.
export function bindPrefs(onChange) {
  const smoothing = document.getElementById("opt-smoothing");
  const log = document.getElementById("opt-log");
  const x = document.getElementById("opt-x");
  const shown = document.getElementById("opt-smoothing-value");
  const prefs = loadPrefs();
  smoothing.value = prefs.smoothing;
  log.checked = prefs.log;
  x.value = prefs.x;
  shown.textContent = prefs.smoothing.toFixed(2);
  const changed = () => {
    const next = { smoothing: Number(smoothing.value), log: log.checked, x: x.value };
    shown.textContent = next.smoothing.toFixed(2);
    try { localStorage.setItem(KEY, JSON.stringify(next)); } catch { /* not kept: still drawn */ }
    onChange(next);
  };
  for (const input of [smoothing, log, x]) input.addEventListener("input", changed);
  return prefs;
}

// An exponential moving average, debiased like TensorBoard's and W&B's (the first points are
// not pulled towards zero); a missing value (a NaN step) keeps the average where it was.
export function ema(values, weight) {
  if (!weight) return values;
  let last = 0, count = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    count += 1;
    // 12 digits: the debiasing's rounding noise would otherwise turn a constant series (a
    // flat learning rate) into a wiggle that autoscaling magnifies
    return Number((last / (1 - weight ** count)).toPrecision(12));
  });
}

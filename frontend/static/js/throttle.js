// Redraws at most once per `everyMs`: `mark(key)` notes a chart whose data changed, and
// `draw(key)` redraws it. Each chart is drawn in a task of its own, so a live step that
// arrives meanwhile waits for one chart at most, not for all of them: a page that redrew every
// chart with every step kept its main thread busy long enough to hold back the loss chart.
export class Throttled {
  constructor(everyMs, draw) {
    this.everyMs = everyMs;
    this.draw = draw;
    this.timer = null;
    this.drawnAt = -Infinity;
    this.dirty = new Set();
  }

  mark(key) {
    this.dirty.add(key);
    this.schedule();
  }

  schedule() {
    if (this.timer !== null || !this.dirty.size) return;
    const wait = Math.max(0, this.drawnAt + this.everyMs - performance.now());
    this.timer = setTimeout(() => this.drawAll(), wait);
  }

  drawAll() {
    this.drawnAt = performance.now();
    const keys = [...this.dirty];
    this.dirty.clear();
    const next = () => {
      if (!keys.length) {
        this.timer = null;
        this.schedule(); // what was marked while these were drawn
        return;
      }
      this.draw(keys.shift());
      this.timer = setTimeout(next, 0);
    };
    next();
  }
}

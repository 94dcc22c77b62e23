"""How the CLI shows the API's answers to a person: rich tables, and a followed job's progress.
(`--json` bypasses all of this and prints the answer as it came.)"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

GB = 1e9


def _table(*columns: str, title: str | None = None) -> Table:
    return Table(*columns, title=title, title_justify="left")


def _step(job: dict[str, Any]) -> str:
    return f"{job.get('step') or 0}/{job.get('total_steps') or '?'}"


def jobs(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _table("id", "name", "state", "step", "owner", "created")
    for job in rows:
        table.add_row(str(job["id"]), job["name"], job["state"], _step(job), job["owner"],
                      job["created_at"][:19])
    console.print(table)


def job(console: Console, job: dict[str, Any]) -> None:
    table = _table("field", "value", title=f"job {job['id']}")
    parallel = job["spec"].get("parallel", {})
    table.add_row("name", job["name"])
    table.add_row("state", job["state"])
    table.add_row("step", _step(job))
    table.add_row("model", str(job["spec"].get("model", {}).get("preset", "custom")))
    table.add_row("layout", f"{parallel.get('nodes', 1)}×{parallel.get('procs_per_node', 1)} "
                  f"{parallel.get('strategy', 'NNN')}")
    for field in ("owner", "created_at", "started_at", "finished_at", "resume_from", "error"):
        if job.get(field):
            table.add_row(field, str(job[field]))
    console.print(table)


def events(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _table("time", "from", "to", "cause", "actor", "message")
    for e in rows:
        table.add_row(e["time"][:19], e["from_state"], e["to_state"], e["cause"], e["actor"],
                      e["message"])
    console.print(table)


def metrics(console: Console, series: dict[str, dict[str, list]]) -> None:
    table = _table("metric", "points", "first step", "last step", "last", "min", "max")
    for name, s in series.items():
        if not s["step"]:
            continue
        low = [v for v in s["min"] if v is not None]
        high = [v for v in s["max"] if v is not None]
        table.add_row(name, str(len(s["step"])), str(s["step"][0]), str(s["step"][-1]),
                      _num(s["value"][-1]), _num(min(low, default=None)),
                      _num(max(high, default=None)))
    console.print(table)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def command(console: Console, cmd: dict[str, Any]) -> None:
    args = " ".join(f"{k}={v}" for k, v in cmd["args"].items())
    console.print(f"{cmd['kind']} {args}".rstrip() + f": command {cmd['id']} {cmd['state']}")


def launched(console: Console, job: dict[str, Any]) -> None:
    console.print(f"job {job['id']} ({job['name']}) {job['state']}")


def checkpoints(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _table("id", "step", "branch", "tier", "strategy", "ranks", "size (MB)",
                   "available")
    for c in rows:
        table.add_row(str(c["id"]), str(c["step"]), c["branch"], c["tier"], c["strategy"],
                      str(c["world_size"]), f"{(c['size_bytes'] or 0) / 1e6:.1f}",
                      "yes" if c["available"] else "deleted")
    console.print(table)


def files(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _table("name", "size (MB)", "path (for a spec)")
    for f in rows:
        table.add_row(f["name"], f"{f['size'] / 1e6:.1f}", f["path"])
    console.print(table)


def datasets(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _table("id", "name", "owner", "state", "tokenizer", "train tokens", "progress")
    for d in rows:
        table.add_row(str(d["id"]), d["name"] + (" (shared)" if d["shared"] else ""),
                      d["owner"], d["state"], d["tokenizer"].rsplit("/", 1)[-1],
                      str((d["manifest"] or {}).get("splits", {}).get("train", {})
                          .get("tokens", "")), progress(d))
    console.print(table)


def progress(d: dict[str, Any]) -> str:
    """A dataset's prepare as one line: documents, tokens, MB/s, ETA."""
    p = d.get("progress") or {}
    if "documents" not in p:
        return "queued" if d["state"] == "preparing" else ""
    eta = p.get("eta_s")
    pace = (f", {p.get('mb_per_s', 0):.1f} MB/s, ETA {'?' if eta is None else f'{eta:.0f}'} s"
            if d["state"] == "preparing" else "")
    return f"{p['documents']} documents, {p['tokens']} tokens{pace}"


def dataset(console: Console, d: dict[str, Any]) -> None:
    table = _table("field", "value", title=f"dataset {d['id']}: {d['name']}")
    for key in ("owner", "state", "shared", "tokenizer", "holdout", "error", "prepared_at",
                "in_use_by"):
        table.add_row(key, str(d[key]))
    for i, source in enumerate(d["sources"]):
        table.add_row(f"source {i}", f"{source['kind']} [{source['field']}]: "
                      + ", ".join(source["paths"]))
    table.add_row("progress", progress(d))
    manifest = d["manifest"] or {}
    if manifest:
        tokenizer = manifest["tokenizer"]
        table.add_row("vocabulary", f"{tokenizer['vocab_size']} ({tokenizer.get('name', '')}, "
                                    f"sha256 {tokenizer.get('sha256', '')[:12]})")
        for split, counts in manifest["splits"].items():
            table.add_row(split, f"{counts['tokens']} tokens, {counts['documents']} documents")
    console.print(table)


def fields(console: Console, answer: dict[str, Any]) -> None:
    """An answer whose shape this client does not know in advance: one row per field."""
    table = _table("field", "value")
    for key, value in answer.items():
        table.add_row(key, str(value))
    console.print(table)


def plan(console: Console, answer: dict[str, Any]) -> None:
    table = _table("strategy", "params GB", "grads GB", "optim GB", "total GB", "step ms",
                   "fits", title=f"per device, budget {answer['memory_budget_bytes'] / GB:g} GB")
    for row in answer["plans"]:
        memory, step = row["memory_bytes"], row["step_time_s"]
        table.add_row(" = ".join(row["names"]), *(f"{memory[k] / GB:.3f}" for k in
                                                  ("params", "grads", "optim", "total")),
                      "–" if step is None else f"{step * 1e3:.1f}", "yes" if row["fits"] else "no")
    console.print(table)
    if answer["plans"]:  # where the step times' compute came from, or why there are none
        console.print(answer["plans"][0]["compute_source"])


class Follow:
    """A followed job on the console: a progress bar with step, loss and tokens/s on a
    terminal (a line every few seconds elsewhere, for logs), and a line for every anomaly,
    action and state change."""

    LOG_EVERY_S = 5.0

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), console=console, disable=not self.live)
        self.task = self.progress.add_task("job", total=None, loss="—", tps="—")
        self.logged_at = 0.0
        self.told: tuple[str, int] | None = None  # the last state line: a job message repeats it

    def __enter__(self) -> Follow:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "snapshot":
            job = message["job"]
            self.progress.update(self.task, description=f"job {job['id']} {job['name']}",
                                 total=job["total_steps"], completed=job["step"] or 0)
            self._state(job["state"], job["step"] or 0)
        elif kind == "step":
            self._step(message)
        elif kind == "job":
            self.progress.update(self.task, total=message.get("total_steps"))
            self._state(message["state"], message.get("step") or 0, message.get("error"))
        elif kind == "anomaly":
            rank = message.get("rank")  # None: a global signal, no single rank
            self._note(f"[red]anomaly[/] {message['kind']} ({message['severity']}) "
                       f"at step {message['step']}" + ("" if rank is None else f", rank {rank}"))
        elif kind == "action":
            by = message.get("by") or "?"
            self._note(f"[yellow]action[/] {message['action']} by {by} at step {message['step']}")

    def _step(self, event: dict[str, Any]) -> None:
        rate = event.get("tokens_per_s")
        loss, tps = _num(event.get("loss")), "—" if rate is None else f"{rate:,.0f}"
        self.progress.update(self.task, completed=event["step"], loss=loss, tps=tps)
        now = time.monotonic()
        if not self.live and now - self.logged_at >= self.LOG_EVERY_S:
            self.logged_at = now
            total = self.progress.tasks[0].total
            self.console.print(f"step {event['step']}/{total or '?'} loss {loss} {tps} tok/s")

    def _state(self, state: str, step: int, error: str | None = None) -> None:
        """A line for a state the job reaches; the snapshot's state, sent again as the first
        live message, is not told twice."""
        if (state, step) == self.told and not error:
            return
        self.told = (state, step)
        self._note(f"{state} at step {step}" + (f": {error}" if error else ""))

    def _note(self, line: str) -> None:
        self.console.print(line)

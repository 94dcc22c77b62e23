"""`ringside`: the platform from the command line; each command is one `Client` call.

Exit codes: 0 done (a followed job completed), 1 the followed job failed, 2 a bad command
line, 3 the followed job paused, 4 it was cancelled (the engine's own exit codes), 5 the
server refused the request (its message is printed, naming the fields) or was unreachable.
`--json` prints every answer as one JSON document, for scripts.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from engine.contract import ExitCode, JobState
from ringside.client import config, render
from ringside.client.api import ApiError, Client

API_ERROR = 5
OUTCOME = {JobState.COMPLETED: ExitCode.COMPLETED, JobState.FAILED: ExitCode.FAILED,
           JobState.PAUSED: ExitCode.PAUSED, JobState.CANCELLED: ExitCode.CANCELLED}

app = typer.Typer(help="Launch, watch and steer Ringside training jobs.",
                  no_args_is_help=True, pretty_exceptions_enable=False,
                  add_completion=False)
jobs = typer.Typer(help="Your jobs: submit, read, steer.", no_args_is_help=True)
checkpoints = typer.Typer(help="A job's checkpoints.", no_args_is_help=True)
app.add_typer(jobs, name="jobs")
files = typer.Typer(help="Your uploaded files: datasets and tokenizers your jobs may read.",
                    no_args_is_help=True)
app.add_typer(checkpoints, name="checkpoints")
app.add_typer(files, name="files")
datasets = typer.Typer(help="Your datasets: register, prepare once, train on by name.",
                       no_args_is_help=True)
app.add_typer(datasets, name="datasets")

JobId = Annotated[int, typer.Argument(help="the job's id")]
FollowOption = Annotated[bool, typer.Option(
    "--follow", "-f", help="watch it live until it settles; exit with its outcome")]


@dataclass
class Session:
    """What the global options chose, handed to every command through the context."""

    url: str | None
    json: bool
    console: Console

    def client(self) -> Client:
        found = config.load(self.url)
        return Client(found.url, found.token)

    def show(self, answer: Any, human) -> None:
        if self.json:
            print(json.dumps(answer, indent=2))
        else:
            human(self.console, answer)


def session(ctx: typer.Context) -> Session:
    return ctx.find_root().obj


@app.callback()
def options(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option(help="the server (default: RINGSIDE_URL, then the "
                                            "one you logged in to)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print answers as JSON")] = False,
) -> None:
    ctx.obj = Session(url, as_json, Console())


@app.command()
def login(ctx: typer.Context,
          username: Annotated[str, typer.Option(prompt=True, help="your user name")]) -> None:
    """Exchange your password for an API token, stored for this user only (mode 0600)."""
    s = session(ctx)
    password = getpass.getpass()
    with s.client() as client:
        client.login(username, password)
        path = config.save(client.url, client.token)
    s.show({"url": client.url, "username": username, "credentials": str(path)},
           lambda console, a: console.print(f"logged in to {a['url']} as {a['username']}; "
                                            f"token stored in {a['credentials']}"))


@jobs.command("submit")
def submit(ctx: typer.Context,
           spec: Annotated[Path, typer.Argument(help="the job spec (JSON; - for stdin)")],
           follow: FollowOption = False) -> None:
    """Launch a job from its spec."""
    text = sys.stdin.read() if str(spec) == "-" else spec.read_text()
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="SPEC") from e
    s = session(ctx)
    with s.client() as client:
        job = client.submit(body)
        if follow:
            if not s.json:
                render.launched(s.console, job)
            _follow(s, client, job["id"])
        s.show(job, render.launched)


@jobs.command("follow")
def follow_job(ctx: typer.Context, job_id: JobId) -> None:
    """Watch a job live until it settles; exit with its outcome."""
    s = session(ctx)
    with s.client() as client:
        _follow(s, client, job_id)


def _follow(s: Session, client: Client, job_id: int) -> None:
    if s.json:
        state = client.wait(job_id)
        s.show(client.job(job_id), render.job)
    else:
        with render.Follow(s.console) as shown:
            state = client.wait(job_id, shown)
    raise typer.Exit(OUTCOME[JobState(state)])


@jobs.command("list")
def list_jobs(ctx: typer.Context,
              state: Annotated[list[str] | None, typer.Option(help="only these states")] = None,
              limit: Annotated[int, typer.Option(help="at most this many")] = 50) -> None:
    """Your jobs, newest first."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.jobs(state, limit), render.jobs)


@jobs.command("show")
def show(ctx: typer.Context, job_id: JobId) -> None:
    """One job."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.job(job_id), render.job)


@jobs.command("events")
def events(ctx: typer.Context, job_id: JobId) -> None:
    """A job's state history, oldest first."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.events(job_id), render.events)


@jobs.command("metrics")
def metrics(ctx: typer.Context, job_id: JobId,
            names: Annotated[list[str] | None, typer.Option("--name", help="only these")] = None,
            start: Annotated[int | None, typer.Option("--from", help="first step")] = None,
            end: Annotated[int | None, typer.Option("--to", help="last step")] = None,
            max_points: Annotated[int | None, typer.Option(help="per series")] = None) -> None:
    """A job's step metrics (loss, tokens/s, ...), downsampled by the server."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.metrics(job_id, names, start, end, max_points), render.metrics)


def _steer(ctx: typer.Context, call) -> dict[str, Any]:
    """Issue one command through `call(client)` and show the server's receipt."""
    s = session(ctx)
    with s.client() as client:
        command = call(client)
    s.show(command, render.command)
    return command


@jobs.command("pause")
def pause(ctx: typer.Context, job_id: JobId,
          warm: Annotated[bool, typer.Option(help="keep the ranks and their state in memory "
                                             "for a fast resume")] = False) -> None:
    """Checkpoint at the next step boundary and stop (cold: freeing the worker)."""
    command = _steer(ctx, lambda client: client.pause(job_id, warm))
    if warm and command["args"].get("mode") != "warm":
        # a server without warm pauses ignores the unknown field: say so, not a silent cold one
        Console(stderr=True).print("warning: this server does not know warm pauses; the job "
                                   "pauses cold (checkpoint, then stop)")


@jobs.command("resume")
def resume(ctx: typer.Context, job_id: JobId) -> None:
    """Queue a paused job again; it continues from its newest checkpoint."""
    _steer(ctx, lambda client: client.resume(job_id))


@jobs.command("checkpoint")
def checkpoint(ctx: typer.Context, job_id: JobId) -> None:
    """Write a checkpoint at the next step boundary."""
    _steer(ctx, lambda client: client.checkpoint(job_id))


@jobs.command("rollback")
def rollback(ctx: typer.Context, job_id: JobId,
             step: Annotated[int | None, typer.Option(help="the newest checkpoint at or "
                                                      "before this step")] = None,
             checkpoint: Annotated[int | None, typer.Option(help="a checkpoint id")] = None,
             skip_data: Annotated[bool, typer.Option(help="skip the data window since "
                                                     "then")] = False) -> None:
    """Go back to a kept checkpoint."""
    if (step is None) == (checkpoint is None):
        raise typer.BadParameter("give exactly one of --step and --checkpoint")
    _steer(ctx, lambda client: client.rollback(job_id, step, checkpoint, skip_data))


@jobs.command("reshard")
def reshard(ctx: typer.Context, job_id: JobId,
            strategy: Annotated[str, typer.Option(help="a PaRO strategy, e.g. GGG")],
            nodes: Annotated[int, typer.Option()],
            procs_per_node: Annotated[int, typer.Option()]) -> None:
    """Checkpoint and relaunch the ranks on another layout."""
    _steer(ctx, lambda client: client.reshard(job_id, strategy, nodes, procs_per_node))


@jobs.command("set")
def set_values(ctx: typer.Context, job_id: JobId,
               values: Annotated[list[str], typer.Argument(help="KEY=VALUE (VALUE as JSON, "
                                                           "else a string)")]) -> None:
    """Change settings of a running job, e.g. `train.lr=0.001`."""
    parsed = dict(_assignment(value) for value in values)
    _steer(ctx, lambda client: client.set(job_id, parsed))


def _assignment(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{text!r} is not KEY=VALUE", param_hint="VALUES")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@jobs.command("rebalance")
def rebalance(ctx: typer.Context, job_id: JobId,
              shares: Annotated[str, typer.Argument(
                  help="samples of each step's batch per rank, e.g. 10,10,10,2; auto: follow "
                       "the ranks' speeds; even")] = "auto") -> None:
    """Set the data-parallel ranks' shares of the batch (a straggler gets less)."""
    _steer(ctx, lambda client: client.rebalance(job_id, _shares(shares)))


def _shares(text: str) -> list[int] | str:
    if text in ("auto", "even"):
        return text
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not auto, even or numbers separated by commas",
                                 param_hint="SHARES") from None


@jobs.command("cancel")
def cancel(ctx: typer.Context, job_id: JobId) -> None:
    """Stop a job for good."""
    _steer(ctx, lambda client: client.cancel(job_id))


@jobs.command("clone")
def clone(ctx: typer.Context, job_id: JobId,
          name: Annotated[str | None, typer.Option(help="default: the original's")] = None,
          checkpoint: Annotated[int | None, typer.Option(help="start from this disk "
                                                         "checkpoint of the original")] = None,
          ) -> None:
    """A new job from this one's spec."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.clone(job_id, name, checkpoint), render.launched)


@checkpoints.command("list")
def list_checkpoints(ctx: typer.Context, job_id: JobId) -> None:
    """A job's checkpoints, oldest first."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.checkpoints(job_id), render.checkpoints)


EXPORT_POLL_S = 2.0


@checkpoints.command("export")
def export(ctx: typer.Context, job_id: JobId,
           checkpoint_id: Annotated[int, typer.Argument(help="the checkpoint's id")],
           wait: Annotated[bool, typer.Option("--wait", help="follow the export until it is "
                                              "done or failed")] = False,
           again: Annotated[bool, typer.Option("--again", help="export anew though an export "
                                               "of it finished")] = False) -> None:
    """Export a checkpoint as a model others can load. Run again, it shows how that export
    is going (it is started once, unless --again)."""
    s = session(ctx)
    with s.client() as client:
        record = None if again else client.export_of(job_id, checkpoint_id)
        if record is None:
            record = client.export_checkpoint(job_id, checkpoint_id)
        while wait and record["state"] in ("pending", "running"):
            time.sleep(EXPORT_POLL_S)
            record = client.export_of(job_id, checkpoint_id) or record
        s.show(record, render.fields)
    if record["state"] == "failed":
        raise typer.Exit(1)


@checkpoints.command("evaluate")
def evaluate(ctx: typer.Context, job_id: JobId,
             checkpoint_id: Annotated[int, typer.Argument(help="the checkpoint's id")],
             tasks: Annotated[str, typer.Option(help="a JSONL task file under your data roots "
                                                "(e.g. one you uploaded)")] = "",
             heldout_windows: Annotated[int, typer.Option(help="held-out windows scored per "
                                                          "source")] = 32,
             wait: Annotated[bool, typer.Option("--wait", help="follow the evaluation until it "
                                                "is done or failed")] = False) -> None:
    """Evaluate a checkpoint: held-out loss and perplexity per source, and your tasks."""
    s = session(ctx)
    with s.client() as client:
        record = client.evaluate_checkpoint(job_id, checkpoint_id, tasks, heldout_windows)
        shown = None
        while wait and record["state"] in ("pending", "running"):
            time.sleep(EXPORT_POLL_S)
            record = next(e for e in client.evaluations(job_id, checkpoint_id)
                          if e["id"] == record["id"])
            progress = (record["state"], record.get("items_done"), record.get("items_total"))
            if progress != shown and record.get("items_total"):  # on stderr: stdout is the record
                typer.echo(f"{record['state']}: {progress[1]}/{progress[2]} items scored", err=True)
            shown = progress
        s.show(record, render.fields)
    if record["state"] == "failed":
        raise typer.Exit(1)


@files.command("upload")
def upload(ctx: typer.Context,
           path: Annotated[Path, typer.Argument(help="the file", exists=True, dir_okay=False)],
           name: Annotated[str | None, typer.Option(help="its name on the server (default: "
                                                    "the file's)")] = None) -> None:
    """Upload a dataset or tokenizer file; prints the path a spec names."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.upload(path, name), render.fields)


@files.command("list")
def list_files(ctx: typer.Context) -> None:
    """Your uploaded files."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.files(), render.files)


DatasetRef = Annotated[str, typer.Argument(help="the dataset's id or name")]
PREPARE_POLL_S = 1.0


@datasets.command("add")
def add_dataset(
        ctx: typer.Context,
        name: Annotated[str, typer.Argument(help="its name (what train.data.mix names)")],
        paths: Annotated[list[str], typer.Argument(help="files or globs under your data roots "
                                                   "(relative: in your uploads)")],
        kind: Annotated[str, typer.Option(help="text, jsonl or parquet")] = "text",
        field: Annotated[str, typer.Option(help="the JSONL field or Parquet column")] = "text",
        tokenizer: Annotated[str, typer.Option(help="bytes, a tokenizer.json or a Hugging "
                                               "Face tokenizer folder")] = "bytes",
        holdout: Annotated[float, typer.Option(help="fraction of documents held out")] = 0.01,
) -> None:
    """Register a dataset (nothing is read until `prepare`)."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.add_dataset({"name": name, "tokenizer": tokenizer, "holdout": holdout,
                                   "sources": [{"kind": kind, "paths": paths,
                                                "field": field}]}), render.dataset)


@datasets.command("prepare")
def prepare_dataset(ctx: typer.Context, ref: DatasetRef, follow: FollowOption = False) -> None:
    """Tokenise it on a worker (a failed or interrupted prepare resumes); with --follow,
    show its progress until it is ready (exit 0) or failed (exit 1)."""
    s = session(ctx)
    with s.client() as client:
        dataset = client.prepare_dataset(client.dataset_id(ref))
        while follow and dataset["state"] == "preparing":
            if not s.json:
                s.console.print(render.progress(dataset) or "queued", highlight=False)
            time.sleep(PREPARE_POLL_S)
            dataset = client.dataset(dataset["id"])
        s.show(dataset, render.dataset)
    if follow and dataset["state"] != "ready":
        raise typer.Exit(ExitCode.FAILED)


@datasets.command("list")
def list_datasets(ctx: typer.Context) -> None:
    """Your datasets and the shared ones."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.datasets(), render.datasets)


@datasets.command("show")
def show_dataset(ctx: typer.Context, ref: DatasetRef) -> None:
    """A dataset: its sources, state, progress and manifest."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.dataset(client.dataset_id(ref)), render.dataset)


@app.command()
def plan(ctx: typer.Context,
         preset: Annotated[str | None, typer.Option(help="model preset (server default: "
                                                    "tiny)")] = None,
         nodes: Annotated[int | None, typer.Option()] = None,
         procs_per_node: Annotated[int | None, typer.Option()] = None,
         grad_accum: Annotated[int | None, typer.Option()] = None,
         collective: Annotated[str | None, typer.Option()] = None,
         memory_budget_gb: Annotated[float | None, typer.Option(help="model-state memory per "
                                                                "device")] = None) -> None:
    """The PaRO planner: memory per device and predicted step time of every strategy."""
    s = session(ctx)
    with s.client() as client:
        s.show(client.plan(preset=preset, nodes=nodes, procs_per_node=procs_per_node,
                           grad_accum=grad_accum, collective=collective,
                           memory_budget_gb=memory_budget_gb), render.plan)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default: the process's arguments); the exit code."""
    try:
        app(args=argv, prog_name="ringside")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    except ApiError as e:
        err = Console(stderr=True)
        for line in e.messages():
            err.print(f"error: {line}", markup=False, highlight=False)
        return API_ERROR
    return 0

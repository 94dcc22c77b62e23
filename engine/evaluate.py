"""Evaluate a checkpoint on one process: held-out loss and perplexity per data source, the
user's offline tasks, and a few generations.

    python -m engine.evaluate CHECKPOINT OUT_DIR [--spec SPEC.json] [--tasks TASKS.jsonl]
                              [--items A:B] [--heldout-windows N] [--device cpu] [--threads N]

The work is a numbered list of items, the same list every time for the same checkpoint, spec
and tasks: first each source's held-out windows (window w of source s is one item, scored
alone, so a score does not depend on what else ran beside it), then the task file's lines in
order. A run scores the items of its range (`--items A:B`, default all) and appends one JSON
line per scored item to `OUT_DIR/items-A-B.jsonl`, flushed as it goes; items already in any
`items-*.jsonl` of OUT_DIR are skipped. So a run stopped at any point resumes where it
stopped, and several runs over disjoint ranges (an elastic evaluation's slots) together score
every item exactly once. Each run prints the summary of what OUT_DIR holds so far; when every
item is scored it is also written to `OUT_DIR/results.json`.

A task file is JSONL, one item a line (an optional `"task"` names the group it is reported in):
- `{"prompt": P, "continuation": C}`: the log-likelihood of C after P, and exact match: C is
  what greedy decoding writes after P (each of C's tokens is the most likely one, as
  lm-evaluation-harness's `is_greedy`);
- `{"prompt": P, "choices": [C0, C1, ...], "answer": i}`: multiple choice, the choice of
  highest log-likelihood after P (lm-evaluation-harness's `acc`);
- `{"prompt": P, "max_new_tokens": n}`: n tokens generated greedily after P (n at most 256).
The task file is read under the spec's data roots, as the run's data was.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.checkpoint import CheckpointError, CheckpointReader
from engine.checkpoint.reader import resolve
from engine.contract import EVALUATION_RESULTS
from engine.data.catalog import open_sources
from engine.data.loader import TokenLoader, heldout_loaders
from engine.data.tokenizers import Tokenizer, load_tokenizer
from engine.errors import DataError, SpecError
from engine.export import ExportError, load_spec
from engine.moe.model import MoEModel
from engine.runtime.confine import open_confined
from engine.runtime.init_from import load_checkpoint_weights
from engine.runtime.spec import JobSpec

MAX_NEW_TOKENS = 256
TASKS_FIELD = "tasks"


class EvaluationError(ValueError):
    """The tasks or the range cannot be evaluated; the message names the line or option."""


@dataclass(frozen=True)
class Item:
    """One unit of work: a held-out window (`source`, `window`) or a task line (`task`)."""

    index: int
    kind: str  # heldout, continuation, choice or generate
    source: str = ""
    window: int = 0
    task: dict[str, Any] | None = None


# --- the item list -----------------------------------------------------------------------


def read_tasks(path: str, roots: Sequence[str]) -> list[dict[str, Any]]:
    """The task file's items, each checked; EvaluationError naming the line at fault."""
    try:
        with open_confined(path, roots, TASKS_FIELD) as f:
            lines = f.read().decode("utf-8").splitlines()
    except SpecError as e:
        raise EvaluationError(str(e)) from e
    except (OSError, UnicodeDecodeError) as e:
        raise EvaluationError(f"{TASKS_FIELD}: cannot read {path!r}: {e}") from e
    tasks = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            tasks.append(_checked_task(line, f"{TASKS_FIELD} line {number}"))
    return tasks


def _checked_task(line: str, where: str) -> dict[str, Any]:
    try:
        task = json.loads(line)
    except ValueError as e:
        raise EvaluationError(f"{where}: not JSON ({e})") from e
    if not isinstance(task, dict) or not isinstance(task.get("prompt"), str) or not task["prompt"]:
        raise EvaluationError(f"{where}: an object with a non-empty \"prompt\" string")
    task["kind"] = _task_kind(task, where)
    task.setdefault("task", task["kind"])
    if not isinstance(task["task"], str):
        raise EvaluationError(f"{where}: \"task\" must be a string")
    return task


def _task_kind(task: dict[str, Any], where: str) -> str:
    if isinstance(task.get("continuation"), str) and task["continuation"]:
        return "continuation"
    choices = task.get("choices")
    if isinstance(choices, list) and choices:
        answer = task.get("answer")
        if not all(isinstance(c, str) and c for c in choices):
            raise EvaluationError(f"{where}: \"choices\" must be non-empty strings")
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(
                choices):
            raise EvaluationError(f"{where}: \"answer\" must be the index of one of the "
                                  f"{len(choices)} choices")
        return "choice"
    n = task.get("max_new_tokens")
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_NEW_TOKENS:
        return "generate"
    raise EvaluationError(f"{where}: needs a \"continuation\", \"choices\" with an \"answer\", "
                          f"or \"max_new_tokens\" (1 to {MAX_NEW_TOKENS})")


def heldout_windows(spec: JobSpec) -> list[TokenLoader]:
    """One loader per source over its held-out split, one window a batch, in order."""
    t = spec.train
    loader = TokenLoader(open_sources(spec), t.seq_len, 1, 0, 1, t.seed, shuffle=False,
                         document_mask=t.data.document_mask)
    return heldout_loaders(loader)


def plan_items(loaders: list[TokenLoader], tasks: list[dict[str, Any]],
               windows_per_source: int) -> list[Item]:
    """Every item, numbered: each source's first held-out windows, then the tasks in order."""
    items = [Item(0, "heldout", source=loader.names[0], window=w)
             for loader in loaders for w in range(min(windows_per_source, loader.windows[0]))]
    items += [Item(0, task["kind"], task=task) for task in tasks]
    return [Item(i, item.kind, item.source, item.window, item.task)
            for i, item in enumerate(items)]


# --- scoring -----------------------------------------------------------------------------


class Scorer:
    """Scores items with one model, one item at a time."""

    def __init__(self, model: MoEModel, tokenizer: Tokenizer, loaders: list[TokenLoader]):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.loaders = {loader.names[0]: loader for loader in loaders}
        self.device = next(model.parameters()).device
        self.max_len = model.config.max_position_embeddings

    @torch.no_grad()
    def score(self, item: Item) -> dict[str, Any]:
        """The item's JSON record: its index and kind, and its scores."""
        scored = getattr(self, f"_{item.kind}")(item)
        return {"index": item.index, "kind": item.kind, **scored}

    def _heldout(self, item: Item) -> dict[str, Any]:
        loader = self.loaders[item.source]
        loader.position = item.window  # unshuffled, one source: sample w is window w
        batch = loader.next_micro_batch()
        out = self.model(batch.input_ids.to(self.device), batch.labels.to(self.device),
                         doc_ids=batch.doc_ids)
        tokens = batch.labels.numel()
        return {"source": item.source, "window": item.window, "tokens": tokens,
                "nll": out.sample_ce[0].item() * tokens}

    def logprobs(self, context: list[int], target: list[int]) -> tuple[float, bool]:
        """The log-likelihood of `target` after `context` (nats), and whether each target
        token is the most likely one; the context is cut from the left to fit the model."""
        if len(target) > self.max_len:
            raise EvaluationError(f"a continuation of {len(target)} tokens is longer than "
                                  f"model.max_position_embeddings ({self.max_len})")
        ids = (context + target)[-(self.max_len + 1):]
        inputs = torch.tensor([ids[:-1]], device=self.device)
        logits = self.model(inputs, inputs, return_logits=True).logits[0, -len(target):]
        wanted = torch.tensor(target, device=self.device)
        logp = F.log_softmax(logits.float(), dim=-1)
        loglik = logp.gather(1, wanted[:, None]).sum().item()
        return loglik, bool(torch.equal(logp.argmax(-1), wanted))

    def _continuation(self, item: Item) -> dict[str, Any]:
        task = item.task
        loglik, greedy = self.logprobs(self.tokenizer.encode(task["prompt"]),
                                       self.tokenizer.encode(task["continuation"]))
        return {"task": task["task"], "loglik": loglik, "exact_match": greedy}

    def _choice(self, item: Item) -> dict[str, Any]:
        task = item.task
        prompt = self.tokenizer.encode(task["prompt"])
        logliks = [self.logprobs(prompt, self.tokenizer.encode(c))[0] for c in task["choices"]]
        chosen = max(range(len(logliks)), key=logliks.__getitem__)
        return {"task": task["task"], "logliks": logliks, "chosen": chosen,
                "correct": chosen == task["answer"]}

    def _generate(self, item: Item) -> dict[str, Any]:
        task = item.task
        ids = self.tokenizer.encode(task["prompt"])
        new: list[int] = []
        for _ in range(task["max_new_tokens"]):  # no cache: the few prompts of a report
            window = torch.tensor([(ids + new)[-self.max_len:]], device=self.device)
            logits = self.model(window, window, return_logits=True).logits[0, -1]
            new.append(int(logits.argmax()))
        return {"task": task["task"], "prompt": task["prompt"],
                "text": self.tokenizer.decode(new)}


# --- records and the summary ---------------------------------------------------------------


def scored_records(out_dir: Path) -> dict[int, dict[str, Any]]:
    """Every item scored in `out_dir` so far, by index. A line cut short by a run stopped
    mid-write is not a record: its item is scored again."""
    records: dict[int, dict[str, Any]] = {}
    for path in sorted(out_dir.glob("items-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            records.setdefault(record["index"], record)
    return records


def summarize(records: dict[int, dict[str, Any]], total: int) -> dict[str, Any]:
    """Held-out loss and perplexity per source, each task's scores, the generations."""
    heldout: dict[str, dict[str, float]] = {}
    tasks: dict[str, dict[str, Any]] = {}
    generations = []
    for record in (records[i] for i in sorted(records)):
        if record["kind"] == "heldout":
            source = heldout.setdefault(record["source"], {"nll": 0.0, "tokens": 0, "windows": 0})
            source["nll"] += record["nll"]
            source["tokens"] += record["tokens"]
            source["windows"] += 1
        elif record["kind"] == "generate":
            generations.append({"prompt": record["prompt"], "text": record["text"]})
        else:
            tasks.setdefault(record["task"], {"kind": record["kind"], "records": []})[
                "records"].append(record)
    return {
        "items_total": total, "items_done": len(records), "complete": len(records) == total,
        "heldout": {name: {"loss": s["nll"] / s["tokens"], "perplexity":
                           math.exp(s["nll"] / s["tokens"]), "tokens": s["tokens"],
                           "windows": s["windows"]} for name, s in heldout.items()},
        "tasks": {name: _task_scores(t["kind"], t["records"]) for name, t in tasks.items()},
        "generations": generations,
    }


def _task_scores(kind: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    if kind == "continuation":
        return {"kind": kind, "items": n,
                "exact_match": sum(r["exact_match"] for r in records) / n,
                "loglik": sum(r["loglik"] for r in records) / n}
    return {"kind": kind, "items": n, "accuracy": sum(r["correct"] for r in records) / n}


# --- the run -------------------------------------------------------------------------------


def parse_range(text: str | None, total: int) -> range:
    """`A:B` (either side may be left out) as the items it names, within [0, total)."""
    if text is None:
        return range(total)
    try:
        start, stop = (int(v) if v else None for v in text.split(":"))
    except ValueError as e:
        raise EvaluationError(f"--items: {text!r} is not A:B (item numbers)") from e
    return range(total)[slice(start, stop)]


def evaluate(checkpoint: str, out_dir: Path, spec: JobSpec, *, tasks: str | None = None,
             items: str | None = None, windows_per_source: int = 32,
             device: str = "cpu") -> dict[str, Any]:
    """Score the items of range `items` not yet in `out_dir`; the summary of what it holds."""
    info = resolve(checkpoint)
    loaders = heldout_windows(spec)
    planned = plan_items(loaders, read_tasks(tasks, spec.data.roots) if tasks else [],
                         windows_per_source)
    wanted = parse_range(items, len(planned))
    out_dir.mkdir(parents=True, exist_ok=True)
    done = scored_records(out_dir)
    todo = [index for index in wanted if index not in done]
    if todo:  # else only the summary: no model to load
        model = MoEModel(spec.model)
        with CheckpointReader(info) as reader:
            load_checkpoint_weights(reader, spec.model, model)
        scorer = Scorer(model.to(device), load_tokenizer(spec.train.dataset.tokenizer,
                                                         spec.data.roots), loaders)
        with open(out_dir / f"items-{wanted.start}-{wanted.stop}.jsonl", "a",
                  encoding="utf-8") as log:
            for index in todo:
                log.write(json.dumps(scorer.score(planned[index])) + "\n")
                log.flush()
    summary = {"checkpoint": str(info.path), "step": info.step,
               **summarize(scored_records(out_dir), len(planned))}
    if summary["complete"]:
        (out_dir / EVALUATION_RESULTS).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.evaluate",
                                     description="Evaluate a Ringside checkpoint.")
    parser.add_argument("checkpoint", help="a checkpoint step folder, or a checkpoint directory "
                                           "(its newest good checkpoint)")
    parser.add_argument("out_dir", type=Path, help="the folder of the per-item records and "
                                                   "results.json")
    parser.add_argument("--spec", type=Path, help="the job spec the run trained with (JSON); "
                                                  "default: the one the checkpoint records")
    parser.add_argument("--tasks", help="a JSONL file of task items (see the module's help)")
    parser.add_argument("--items", help="A:B, the range of items this run scores")
    parser.add_argument("--heldout-windows", type=int, default=32,
                        help="held-out windows scored per source (default 32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch's intra-op threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        summary = evaluate(args.checkpoint, args.out_dir, load_spec(args.spec, args.checkpoint),
                           tasks=args.tasks, items=args.items,
                           windows_per_source=args.heldout_windows, device=args.device)
    except (EvaluationError, ExportError, CheckpointError, DataError, OSError, ValueError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m engine.data prepare SOURCES... --tokenizer T --out DIR`: prepare a dataset
without the platform, with a progress bar; `python -m engine.data verify DIR` checks one."""

from __future__ import annotations

import argparse
import json
import sys

from engine.data.prepare import PrepareProgress, prepare
from engine.data.shards import PreparedDataset
from engine.data.sources import SourceSpec
from engine.errors import DataError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.data")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="tokenise sources into token shards")
    p.add_argument("sources", nargs="+", help="files, globs or s3:// prefixes")
    p.add_argument("--kind", choices=["text", "jsonl", "parquet"],
                   help="default: from the first source's extension")
    p.add_argument("--field", default="text", help="the JSONL field or Parquet column")
    p.add_argument("--tokenizer", default="bytes",
                   help="bytes, a tokenizer.json, or a Hugging Face tokenizer folder")
    p.add_argument("--out", required=True, help="a folder or an s3:// URL")
    p.add_argument("--holdout", type=float, default=0.01, help="fraction of documents held out")
    p.add_argument("--workers", type=int, default=0, help="processes (default: every core)")
    v = commands.add_parser("verify", help="check a prepared dataset's sizes and checksums")
    v.add_argument("path")
    return parser


def guess_kind(path: str) -> str:
    for suffix, kind in ((".jsonl", "jsonl"), (".json", "jsonl"), (".parquet", "parquet")):
        if path.rstrip("/").endswith(suffix):
            return kind
    return "text"


def _prepare(args: argparse.Namespace) -> dict:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    kind = args.kind or guess_kind(args.sources[0])
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("preparing", total=None, rate="")

        def show(p: PrepareProgress) -> None:
            bar.update(task, completed=p.bytes_read, total=p.bytes_total,
                       description=f"{p.documents:,} documents, {p.tokens:,} tokens, "
                                   f"shard {p.shards_done}/{p.shards_total}",
                       rate=f"{p.mb_per_s:.1f} MB/s")

        return prepare([SourceSpec(kind, args.sources, args.field)], args.tokenizer, args.out,
                       holdout=args.holdout, workers=args.workers, progress=show)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            manifest = _prepare(args)
        else:
            manifest = PreparedDataset.open(args.path, verify=True).manifest
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    counts = {split: {k: manifest["splits"][split][k] for k in ("tokens", "documents")}
              for split in manifest["splits"]}
    print(json.dumps({"tokenizer": manifest["tokenizer"], "dtype": manifest["dtype"],
                      "splits": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

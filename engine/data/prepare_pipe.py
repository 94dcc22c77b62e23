"""The prepare of one dataset over pipes (`python -m engine.data.prepare_pipe`), the platform's
way to run it in a process of its own: its worker's task (datasets.tasks) writes what to
prepare as one JSON object on stdin, and reads one JSON line per progress report
(`{"progress": {...}}`) and the manifest at the end (`{"manifest": {...}}`) on stdout. A process
of its own, because it tokenises over worker processes of its own, which a Celery pool process
(daemonic) may not start, and its memory goes back when it exits. A refusal (a path outside
the roots, a corrupt file) is one line on stderr, exit 1."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from engine.data.prepare import PrepareProgress, prepare
from engine.data.sources import SourceSpec
from engine.errors import ConfigError


def report(kind: str, value: Any) -> None:
    print(json.dumps({kind: value}), flush=True)


def progress(p: PrepareProgress) -> None:
    report("progress", {**dataclasses.asdict(p), "mb_per_s": p.mb_per_s, "eta_s": p.eta_s})


def main() -> int:
    order = json.load(sys.stdin)
    sources = [SourceSpec(kind=s["kind"], paths=s["paths"], field=s["field"])
               for s in order["sources"]]
    shards = {"shard_bytes": order["shard_bytes"]} if order.get("shard_bytes") else {}
    try:
        manifest = prepare(sources, order["tokenizer"], order["out"], holdout=order["holdout"],
                           roots=order["roots"], workers=order["workers"],
                           progress=progress, **shards)
    except ConfigError as e:  # a spec's or a data error: its message names what is wrong
        print(str(e).replace("\n", " "), file=sys.stderr)
        return 1
    report("manifest", manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

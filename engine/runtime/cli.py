"""`python -m engine.train SPEC.json`: train a job from the command line.

Without `--bus`, events go to a JSONL file only (default `<run dir>/events.jsonl`); with
`--bus REDIS_URL --job ID`, rank 0 also publishes them to the job's Redis stream.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.contract import ExitCode
from engine.runtime.launch import RunDirInUse, RunTarget, launch
from engine.runtime.spec import SpecError, parse_spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.train", description="Train a Ringside MoE job from a JSON spec."
    )
    parser.add_argument("spec", type=Path, help="the job spec (JSON)")
    parser.add_argument(
        "--events", type=Path, help="JSONL event file (default: RUN_DIR/events.jsonl)"
    )
    parser.add_argument("--run-dir", type=Path, help="the run's folder (default: runs/<name>)")
    parser.add_argument("--bus", metavar="REDIS_URL", help="also publish events to this Redis")
    parser.add_argument("--job", help="job id on the bus (default: the spec's name)")
    parser.add_argument(
        "--resume", type=Path, metavar="DIR",
        help="continue from the newest good checkpoint in DIR (or from the checkpoint DIR)",
    )
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="serve the latest per-op and per-rank aggregates as Prometheus text on PORT",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data = json.loads(args.spec.read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"spec: no such file: {args.spec}", file=sys.stderr)
        return ExitCode.USAGE
    except ValueError as e:
        print(f"spec: {args.spec} is not valid JSON: {e}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        spec = parse_spec(data)
    except SpecError as e:
        print(f"spec: {args.spec} is invalid:", file=sys.stderr)
        for field, message in e.errors.items():
            print(f"  {field or '(root)'}: {message}", file=sys.stderr)
        return ExitCode.USAGE
    run_dir = args.run_dir or Path("runs") / spec.name
    target = RunTarget(
        run_dir=run_dir,
        events_path=args.events or run_dir / "events.jsonl",
        job=args.job or spec.name,
        bus_url=args.bus,
        resume_from=args.resume,
        metrics_port=args.metrics_port,
    )
    try:
        return launch(spec, target)
    except RunDirInUse as e:
        print(f"run: {e}", file=sys.stderr)
        return ExitCode.USAGE

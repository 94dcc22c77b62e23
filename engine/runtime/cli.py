"""`python -m engine.train SPEC.json`: train a job from the command line.

Without `--bus`, events go to a JSONL file only (default `<run dir>/events.jsonl`); with
`--bus REDIS_URL --job ID`, rank 0 also publishes them to the job's Redis stream.
On several hosts, each runs the same command with torchrun's arguments (`--nnodes`,
`--rdzv-endpoint`, `--rdzv-id`, `--local-addr`) and its own `--node-rank` (0: the lead, on the
endpoint's host); each host runs world_size / nnodes ranks.
Under Slurm, `srun` runs it once per node with `--rendezvous slurm` instead: the allocation
says the hosts (engine.runtime.slurm).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from multiprocessing import forkserver
from pathlib import Path

from engine.contract import ExitCode
from engine.ports import interface_of
from engine.runtime.rendezvous import Rendezvous
from engine.runtime.spec import JobSpec, SpecError, parse_spec

# what the ranks run, imported once in the forkserver they fork from (torch and the engine)
RANKS_MODULE = "engine.runtime.launch"


def nnodes(text: str) -> tuple[int, int]:
    """`N` or `MIN:MAX` hosts, as torchrun's --nnodes."""
    low, _, high = text.partition(":")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or MIN:MAX") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: needs 1 <= MIN <= MAX")
    return bounds


def rdzv_conf(text: str) -> dict[str, str]:
    """`KEY=VALUE,...`: settings of the c10d rendezvous (torchrun's --rdzv-conf), such as
    `last_call_timeout` or `keep_alive_interval` (seconds)."""
    pairs = [item.partition("=") for item in text.split(",") if item]
    if any(not key or not sep for key, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE,...")
    return {key: value for key, _, value in pairs}


def endpoint(text: str) -> str:
    """HOST:PORT (an IPv6 host in brackets)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return text


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
    hosts = parser.add_argument_group("several hosts (as torchrun)")
    hosts.add_argument("--nnodes", type=nnodes, default=(1, 1), metavar="N|MIN:MAX",
                       help="hosts of the job, each running this command (default: 1)")
    hosts.add_argument("--rdzv-endpoint", type=endpoint, metavar="HOST:PORT",
                       help="the c10d rendezvous, on the lead host (default: 127.0.0.1 and "
                            "a free port; needed with --nnodes above 1)")
    hosts.add_argument("--node-rank", type=int, metavar="N",
                       help="this host's number among the job's, 0 to N-1 (needed with --nnodes "
                            "above 1): 0 is the lead, on the --rdzv-endpoint's host")
    hosts.add_argument("--rdzv-id", default="", metavar="ID",
                       help="the rendezvous's run id, the same on every host (default: --job)")
    hosts.add_argument("--rdzv-conf", type=rdzv_conf, default={}, metavar="KEY=VALUE,...",
                       help="rendezvous settings, e.g. last_call_timeout=5 (seconds)")
    hosts.add_argument("--local-addr", metavar="ADDR",
                       help="the address the other hosts reach this one at (default: the "
                            "host name's)")
    hosts.add_argument("--rendezvous", choices=("args", "slurm"), default="args",
                       help="where the hosts come from: the arguments above (default), or "
                            "the Slurm allocation this runs in (one launcher per node, "
                            "under srun)")
    return parser


def rendezvous(args: argparse.Namespace, spec: JobSpec) -> Rendezvous:
    """The rendezvous the arguments ask for; ValueError naming the argument if the spec's
    nodes do not spread over the hosts, or several hosts have no endpoint to meet at. On
    several hosts gloo binds where the others reach this one, unless the operator named an
    interface. Under `--rendezvous args` it imports nothing of torch: the caller starts the
    ranks' forkserver next (`start_ranks_server`)."""
    if args.rendezvous == "slurm":
        from engine.runtime import slurm

        rdzv = slurm.rendezvous(os.environ, args.rdzv_conf)
        if spec.parallel.nodes % rdzv.max_nodes:
            raise ValueError(f"--rendezvous slurm: parallel.nodes ({spec.parallel.nodes}) must "
                             f"be a multiple of the allocated nodes ({rdzv.max_nodes})")
        if rdzv.max_nodes > 1:  # gloo binds where the other nodes reach this one
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(rdzv.local_addr))
        return rdzv
    low, high = args.nnodes
    if spec.parallel.nodes % high:
        raise ValueError(f"--nnodes: parallel.nodes ({spec.parallel.nodes}) must be a multiple "
                         f"of the hosts ({high}): each host runs whole nodes")
    if high > 1 and not args.rdzv_endpoint:
        raise ValueError("--rdzv-endpoint: a job on several hosts needs one, on the lead host")
    if high > 1 and not (args.node_rank is not None and 0 <= args.node_rank < high):
        raise ValueError(f"--node-rank: a job on several hosts numbers each, 0 to {high - 1} "
                         "(0 the lead, on the endpoint's host)")
    if high > 1 and args.local_addr and "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo binds where the other hosts reach this one (an operator's own choice stands)
        os.environ["GLOO_SOCKET_IFNAME"] = interface_of(args.local_addr)
    return Rendezvous(min_nodes=low, max_nodes=high, endpoint=args.rdzv_endpoint or "",
                      run_id=args.rdzv_id or args.job or spec.name, local_addr=args.local_addr,
                      configs=args.rdzv_conf, node_rank=args.node_rank or 0)


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
    try:
        rdzv = rendezvous(args, spec)
    except ValueError as e:
        print(e, file=sys.stderr)
        return ExitCode.USAGE
    if args.rendezvous == "args":  # under Slurm, engine.runtime.launch (start_ranks_server)
        start_ranks_server()
    from engine.runtime.launch import RunDirInUse, RunTarget, launch

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
        return launch(spec, target, rdzv)
    except RunDirInUse as e:
        print(f"run: {e}", file=sys.stderr)
        return ExitCode.USAGE


def start_ranks_server() -> None:
    """Start the forkserver the ranks fork from, importing the engine (torch) beside this
    launcher's own import of it instead of after it (two imports of torch in a row were a
    third of a relaunch on a busy host: a lost host's survivors reach their first step
    seconds sooner). Only once this process's environment is final, as the ranks inherit the
    forkserver's (under Slurm it is not yet: `engine.runtime.launch` starts it there); this
    module imports the engine only after it for that reason."""
    multiprocessing.set_forkserver_preload([RANKS_MODULE])
    forkserver.ensure_running()

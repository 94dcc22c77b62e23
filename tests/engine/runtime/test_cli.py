"""The command line's multi-host arguments (as torchrun's) and the lead rule; refusals name
the argument and end with the usage exit code before anything runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.contract import ExitCode
from engine.ports import interface_of
from engine.runtime.cli import build_parser, main, rendezvous
from engine.runtime.launch import RunTarget
from engine.runtime.rendezvous import Rendezvous
from engine.runtime.spec import parse_spec

ROOT = Path(__file__).resolve().parents[3]


def spec_file(tmp_path, nodes: int = 2, procs_per_node: int = 2) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "hosts", "parallel": {
        "nodes": nodes, "procs_per_node": procs_per_node}}))
    return str(path)


def test_the_defaults_are_one_host_at_a_free_loopback_port():
    args = build_parser().parse_args(["spec.json"])
    assert (args.nnodes, args.rdzv_endpoint, args.rdzv_id, args.local_addr, args.rdzv_conf) == (
        (1, 1), None, "", None, {})
    assert Rendezvous().node_rank == 0 and Rendezvous().host == "127.0.0.1"


@pytest.mark.parametrize("value, bounds", [("2", (2, 2)), ("1:3", (1, 3)), ("4:4", (4, 4))])
def test_nnodes_takes_n_or_min_max(value, bounds):
    assert build_parser().parse_args(["s", "--nnodes", value]).nnodes == bounds


def test_rendezvous_settings_pass_through_as_torchruns():
    args = build_parser().parse_args(["s", "--rdzv-conf", "last_call_timeout=5,join_timeout=60"])
    assert args.rdzv_conf == {"last_call_timeout": "5", "join_timeout": "60"}


@pytest.mark.parametrize("argv, message", [
    (["--rdzv-conf", "last_call_timeout"], "argument --rdzv-conf: 'last_call_timeout' is not"),
    (["--nnodes", "two"], "argument --nnodes: 'two' is not N or MIN:MAX"),
    (["--nnodes", "0"], "argument --nnodes: '0': needs 1 <= MIN <= MAX"),
    (["--nnodes", "3:2"], "argument --nnodes: '3:2': needs 1 <= MIN <= MAX"),
    (["--rdzv-endpoint", "10.0.0.1"], "argument --rdzv-endpoint: '10.0.0.1' is not HOST:PORT"),
    (["--rdzv-endpoint", "h:70000"], "argument --rdzv-endpoint: 'h:70000' is not HOST:PORT"),
])
def test_a_malformed_argument_is_refused_by_name(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main([spec_file(tmp_path), *argv])
    assert exited.value.code == ExitCode.USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("nodes, argv, message", [
    (3, ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29500"],
     "--nnodes: parallel.nodes (3) must be a multiple of the hosts (2)"),
    (1, ["--nnodes", "1:2", "--rdzv-endpoint", "10.0.0.1:29500"],
     "--nnodes: parallel.nodes (1) must be a multiple of the hosts (2)"),
    (2, ["--nnodes", "2"], "--rdzv-endpoint: a job on several hosts needs one"),
    (2, ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29500"],
     "--node-rank: a job on several hosts numbers each, 0 to 1"),
    (2, ["--nnodes", "1:2", "--rdzv-endpoint", "10.0.0.1:29500", "--node-rank", "2"],
     "--node-rank: a job on several hosts numbers each, 0 to 1"),
    (2, ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29500", "--node-rank", "-1"],
     "--node-rank: a job on several hosts numbers each, 0 to 1"),
])
def test_hosts_the_spec_cannot_spread_over_are_refused_naming_the_argument(
        tmp_path, capsys, nodes, argv, message):
    assert main([spec_file(tmp_path, nodes=nodes), *argv]) == ExitCode.USAGE
    assert message in capsys.readouterr().err


def test_the_lead_is_node_rank_0_as_whoever_placed_the_hosts_numbered_them(tmp_path):
    """Never guessed from the endpoint's address: two launchers on one machine (or in one
    network namespace) are still one lead and one other."""
    spec = parse_spec({"name": "hosts", "parallel": {"nodes": 2}})
    for rank, leads in ((0, True), (1, False)):
        args = build_parser().parse_args(["s", "--nnodes", "2", "--rdzv-endpoint",
                                          "127.0.0.1:29500", "--node-rank", str(rank)])
        rdzv = rendezvous(args, spec)
        assert rdzv.node_rank == rank
        target = RunTarget(tmp_path, tmp_path / "events.jsonl", "j", node_rank=rdzv.node_rank)
        assert target.lead is leads
    assert Rendezvous(max_nodes=2, endpoint="[::1]:29500").host == "::1"


# run as `python -m engine.train` runs it, reporting whether the ranks' forkserver was up when
# the launcher began importing torch
WATCHED_LAUNCH = """
import sys
from multiprocessing import forkserver

class FirstTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("forkserver up" if forkserver._forkserver._forkserver_pid else "no forkserver")
        return None

sys.meta_path.insert(0, FirstTorchImport())
from engine.runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_ranks_forkserver_imports_the_engine_beside_the_launchers_own_import(tmp_path):
    """A launch (a lost host's relaunch among them) imports torch twice, in the launcher and
    in the forkserver its ranks fork from: the forkserver is started before the launcher's
    import, so the two run at once rather than one after the other."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "name": "forkserver", "model": {"preset": "nano"},
        "parallel": {"nodes": 1, "procs_per_node": 1},
        "train": {"steps": 1, "micro_batch": 1, "seq_len": 16, "eval_every": 0,
                  "trace_every": 0, "device": "cpu"},
        "checkpoint": {"every": 0}}))
    run = subprocess.run([sys.executable, "-c", WATCHED_LAUNCH, str(spec),
                          "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == ExitCode.COMPLETED, run.stderr[-2000:]
    assert run.stdout.splitlines()[0] == "forkserver up"


def test_a_launcher_on_several_hosts_binds_gloo_where_the_others_reach_it(
        tmp_path, monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    argv = [spec_file(tmp_path), "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500",
            "--node-rank", "0"]
    spec = parse_spec(json.loads((tmp_path / "spec.json").read_text()))
    rendezvous(build_parser().parse_args(argv), spec)  # no --local-addr: gloo's own choice
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    rendezvous(build_parser().parse_args([*argv, "--local-addr", "127.0.0.1"]), spec)
    assert os.environ["GLOO_SOCKET_IFNAME"] == interface_of("127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nic0")  # the operator's own choice stands
    rendezvous(build_parser().parse_args([*argv, "--local-addr", "127.0.0.1"]), spec)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "nic0"

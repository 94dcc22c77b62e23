"""The command line's multi-host arguments (as torchrun's) and the lead rule; refusals name
the argument and end with the usage exit code before anything runs."""

import json
import os
import socket

import pytest

from engine.contract import ExitCode
from engine.ports import interface_of
from engine.runtime.cli import build_parser, main, rendezvous
from engine.runtime.launch import Rendezvous, is_this_host
from engine.runtime.spec import parse_spec


def spec_file(tmp_path, nodes: int = 2, procs_per_node: int = 2) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "hosts", "parallel": {
        "nodes": nodes, "procs_per_node": procs_per_node}}))
    return str(path)


def test_the_defaults_are_one_host_at_a_free_loopback_port():
    args = build_parser().parse_args(["spec.json"])
    assert (args.nnodes, args.rdzv_endpoint, args.rdzv_id, args.local_addr, args.rdzv_conf) == (
        (1, 1), None, "", None, {})
    assert Rendezvous().is_lead()
    assert Rendezvous().host == "127.0.0.1"


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
])
def test_hosts_the_spec_cannot_spread_over_are_refused_naming_the_argument(
        tmp_path, capsys, nodes, argv, message):
    assert main([spec_file(tmp_path, nodes=nodes), *argv]) == ExitCode.USAGE
    assert message in capsys.readouterr().err


def test_the_lead_is_the_launcher_on_the_endpoints_host():
    for host in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        assert is_this_host(host), host
    assert not is_this_host("192.0.2.1")  # TEST-NET-1: no machine's address
    assert not is_this_host("no-such-host.invalid")
    assert Rendezvous(max_nodes=2, endpoint="127.0.0.1:29500").is_lead()
    assert not Rendezvous(max_nodes=2, endpoint="192.0.2.1:29500").is_lead()
    assert Rendezvous(max_nodes=2, endpoint="[::1]:29500").host == "::1"
    # a job on one host is led by its only launcher, wherever its endpoint is
    assert Rendezvous(max_nodes=1, endpoint="192.0.2.1:29500").is_lead()


def test_a_launcher_on_several_hosts_binds_gloo_where_the_others_reach_it(
        tmp_path, monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    argv = [spec_file(tmp_path), "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"]
    spec = parse_spec(json.loads((tmp_path / "spec.json").read_text()))
    rendezvous(build_parser().parse_args(argv), spec)  # no --local-addr: gloo's own choice
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    rendezvous(build_parser().parse_args([*argv, "--local-addr", "127.0.0.1"]), spec)
    assert os.environ["GLOO_SOCKET_IFNAME"] == interface_of("127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nic0")  # the operator's own choice stands
    rendezvous(build_parser().parse_args([*argv, "--local-addr", "127.0.0.1"]), spec)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "nic0"

"""A job on two hosts: one launcher per host, as torchrun runs it, each host a network
namespace of the emulated cluster (bench.cluster), the checkpoints in a folder both see.
Its losses are the same job's on one host, and an elastic one (--nnodes 1:2) that loses a
host goes on alone from its newest checkpoint with the same global batch. Needs root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cluster import ClusterSpec, address, cluster, node_ns
from engine.checkpoint import list_checkpoints
from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]
PORT = 29500  # the rendezvous, in the lead host's namespace: nothing else listens there

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="the two hosts are network namespaces: creating them needs root and iproute2",
)


@pytest.fixture
def hosts(monkeypatch):
    """Two hosts on one 10 Gbit/s switch: `rsa-n0` (10.213.0.1) and `rsa-n1` (10.213.0.2);
    gone afterwards, with anything still running inside them."""
    monkeypatch.setenv("RINGSIDE_CLUSTER", "rsa")  # namespaces are global: our own names
    with cluster(ClusterSpec(nodes=2, procs_per_node=1, inter_gbit=10)) as spec:
        yield spec


def job(tmp_path: Path, name: str) -> dict:
    return {
        "name": name,
        "model": {"preset": "tiny"},
        "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": 2},
        "train": {"steps": 6, "micro_batch": 2, "seq_len": 64, "warmup": 2, "eval_every": 0,
                  "threads": 1},
        "checkpoint": {"every": 3, "dir": str(tmp_path / name / "shared-checkpoints")},
    }


def start_host(node: int, spec: Path, run_dir: Path, *args: str) -> subprocess.Popen:
    """This host's launcher in its namespace; gloo and the rendezvous on its NIC."""
    run_dir.mkdir(parents=True)
    with (run_dir / "console.log").open("w") as console:
        return subprocess.Popen(
            ["ip", "netns", "exec", node_ns(node), sys.executable, "-m", "engine.train",
             str(spec), "--run-dir", str(run_dir), "--rdzv-endpoint", f"{address(0, 0)}:{PORT}",
             "--rdzv-id", spec.stem, "--local-addr", address(node, 0), "--node-rank", str(node),
             *args],
            cwd=REPO, stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "GLOO_SOCKET_IFNAME": "nic0"},
        )


def wait_all(procs: list[subprocess.Popen], run_dirs: list[Path], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        logs = "\n".join((d / "console.log").read_text()[-3000:] for d in run_dirs)
        pytest.fail(f"the launchers did not end within {timeout} s:\n{logs}")


def losses(events: list[dict]) -> list[float]:
    """By step; a step trained again after a restart counts once, as it was last trained."""
    return list({e["step"]: e["loss"] for e in events if e["type"] == "step"}.values())


@pytest.fixture(scope="module")
def one_host(tmp_path_factory) -> list[float]:
    """The losses of the same job with its four ranks on one host."""
    folder = tmp_path_factory.mktemp("one-host")
    alone = parse_spec(job(folder, "one"))
    target = RunTarget(run_dir=folder / "one", events_path=folder / "one.jsonl", job="one")
    assert launch(alone, target) == 0
    curve = losses(read_events(target.events_path))
    assert len(curve) == 6
    return curve


def write_job(tmp_path: Path, name: str) -> tuple[dict, Path]:
    data = job(tmp_path, name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return data, path


def test_a_job_on_two_hosts_trains_as_it_does_on_one(hosts, tmp_path, one_host):
    data, spec_path = write_job(tmp_path, "two")
    run_dirs = [tmp_path / "host0", tmp_path / "host1"]
    procs = [start_host(node, spec_path, run_dirs[node], "--nnodes", "2") for node in (1, 0)]
    procs.reverse()
    codes = wait_all(procs, run_dirs, timeout=120)
    consoles = "\n".join((d / "console.log").read_text()[-3000:] for d in run_dirs)
    assert codes == [0, 0], consoles

    # the lead (the endpoint's host) publishes the lifecycle and rank 0's events; the other
    # host publishes nothing
    events = read_events(run_dirs[0] / "events.jsonl")
    states = [(e["state"], e.get("world_size")) for e in events if e["type"] == "state"]
    assert states == [("starting", 4), ("running", 4), ("completed", None)]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert not (run_dirs[1] / "events.jsonl").exists()
    shared = Path(data["checkpoint"]["dir"])
    assert [c.step for c in list_checkpoints(shared)] == [3, 6]
    assert {c.world_size for c in list_checkpoints(shared)} == {4}

    assert losses(events) == pytest.approx(one_host, rel=1e-4)


@pytest.mark.bench  # half a minute of training and a relaunch: make bench
def test_an_elastic_job_that_loses_a_host_goes_on_alone_with_the_same_global_batch(
        hosts, tmp_path, one_host):
    data, spec_path = write_job(tmp_path, "elastic")
    run_dirs = [tmp_path / "host0", tmp_path / "host1"]
    # a lost host is noticed in 2 s; a round waits 6 s for late hosts once one has come
    # (the other host starts first: it must make the first round, or it would be a restart)
    args = ("--nnodes", "1:2", "--rdzv-conf",
            "last_call_timeout=6,keep_alive_interval=1,keep_alive_max_attempt=2")
    other = start_host(1, spec_path, run_dirs[1], *args)
    lead = start_host(0, spec_path, run_dirs[0], *args)
    shared = Path(data["checkpoint"]["dir"])
    deadline = time.monotonic() + 120
    while not any(c.step == 3 and c.good for c in list_checkpoints(shared)):
        assert time.monotonic() < deadline and lead.poll() is None, (
            (run_dirs[0] / "console.log").read_text()[-3000:])
        time.sleep(0.2)
    os.killpg(other.pid, signal.SIGKILL)  # the host and its ranks, gone at once
    other.wait()
    assert wait_all([lead], run_dirs[:1], timeout=120) == [0], (
        (run_dirs[0] / "console.log").read_text()[-3000:])

    events = read_events(run_dirs[0] / "events.jsonl")
    running = [e["world_size"] for e in events if e["type"] == "state" and e["state"] == "running"]
    assert running == [4, 2]
    notes = [e["message"] for e in events if e["type"] == "log" and e["level"] == "warning"]
    assert any("the rendezvous gave 1 of 2 hosts: 1 nodes, micro_batch 2, grad_accum 2" in n
               for n in notes)
    assert losses(events) == pytest.approx(one_host, rel=1e-4)
    assert [e["state"] for e in events if e["type"] == "state"][-1] == "completed"


@pytest.mark.bench  # half a minute of training and a relaunch: make bench
def test_a_reshard_relaunches_every_host_on_the_new_layout(hosts, tmp_path, one_host):
    data, spec_path = write_job(tmp_path, "moved")
    run_dirs = [tmp_path / "host0", tmp_path / "host1"]
    procs = [start_host(node, spec_path, run_dirs[node], "--nnodes", "2") for node in (1, 0)]
    procs.reverse()
    events_path = run_dirs[0] / "events.jsonl"
    deadline = time.monotonic() + 120
    while not (events_path.exists() and any(e["type"] == "step"
                                            for e in read_events(events_path))):
        assert time.monotonic() < deadline and procs[0].poll() is None, (
            (run_dirs[0] / "console.log").read_text()[-3000:])
        time.sleep(0.2)
    with (run_dirs[0] / "control.jsonl").open("a") as control:  # rank 0 reads it: the lead's
        control.write(json.dumps({"kind": "reshard", "args": {"procs_per_node": 1}}) + "\n")
    codes = wait_all(procs, run_dirs, timeout=180)
    assert codes == [0, 0], "\n".join((d / "console.log").read_text()[-3000:] for d in run_dirs)

    events = read_events(events_path)
    states = [(e["state"], e.get("world_size")) for e in events if e["type"] == "state"]
    assert states == [("starting", 4), ("running", 4), ("resharding", None), ("running", 2),
                      ("completed", None)]
    assert losses(events) == pytest.approx(one_host, rel=1e-4)

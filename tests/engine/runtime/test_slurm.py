"""engine.runtime.slurm: the rendezvous a launcher reads from its Slurm allocation (the real
launch under `srun` is specified with the platform's Slurm backend,
tests/platform/jobs/backends/test_slurm.py)."""

from __future__ import annotations

import json

import pytest

from engine.contract import TIME_LIMIT_COMMAND
from engine.runtime.slurm import (
    PORT_BASE,
    SlurmEnvironmentError,
    expand_nodelist,
    rendezvous,
    warn,
)


@pytest.mark.parametrize("text, names", [
    ("node7", ["node7"]),
    ("a[1-3,7]", ["a1", "a2", "a3", "a7"]),
    ("gpu-x[08-10],login", ["gpu-x08", "gpu-x09", "gpu-x10", "login"]),
    ("rs-h[0-1],b[2]", ["rs-h0", "rs-h1", "b2"]),
])
def test_a_compressed_node_list_expands_as_scontrol_show_hostnames_does(text, names):
    assert expand_nodelist(text) == names


def test_a_node_list_it_cannot_read_is_refused():
    with pytest.raises(SlurmEnvironmentError, match="SLURM_JOB_NODELIST"):
        expand_nodelist("a[x-3]")


def test_the_first_node_hosts_the_store_at_a_port_of_the_job_and_each_node_says_its_address():
    env = {"SLURM_JOB_NODELIST": "localhost,127.0.0.1", "SLURM_NNODES": "2",
           "SLURM_NODEID": "1", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3"}
    rdzv = rendezvous(env)
    assert (rdzv.min_nodes, rdzv.max_nodes) == (2, 2)
    assert rdzv.endpoint == f"127.0.0.1:{PORT_BASE + 42}"
    assert rdzv.local_addr == "127.0.0.1"
    assert rdzv.run_id == "slurm-42-3"  # a requeued job meets under a run id of its own
    assert rdzv.node_rank == 1  # SLURM_NODEID: the first node, which holds the store, leads


def test_a_one_node_allocation_meets_on_its_own_loopback():
    rdzv = rendezvous({"SLURM_JOB_NODELIST": "gpu7", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                       "SLURM_JOB_ID": "9"})
    assert (rdzv.max_nodes, rdzv.endpoint, rdzv.run_id) == (1, "", "slurm-9-0")
    assert rdzv.node_rank == 0


@pytest.mark.parametrize("env, says", [
    ({"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "1"}, "SLURM_NODELIST"),
    ({"SLURM_JOB_NODELIST": "a[1-2]", "SLURM_NNODES": "3", "SLURM_NODEID": "0",
      "SLURM_JOB_ID": "1"}, "SLURM_NNODES=3"),
])
def test_outside_an_allocation_the_launcher_says_what_is_missing(env, says):
    with pytest.raises(SlurmEnvironmentError, match=says):
        rendezvous(env)


def test_the_time_limit_warning_asks_the_ranks_for_a_pause_they_know_by_its_id(tmp_path):
    assert warn(["--job", "j", "--run-dir", str(tmp_path)]) == 0
    command = json.loads((tmp_path / "control.jsonl").read_text())
    assert command == {"kind": "pause", "args": {}, "id": TIME_LIMIT_COMMAND}

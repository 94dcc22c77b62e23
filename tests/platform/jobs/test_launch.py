"""The engine's launcher: it runs with the environment it needs and none of the platform's
secrets (a training run executes what a user's spec and data make it do), and the job's error
shows no server path outside the job's own run folder and its owner's uploads."""

from __future__ import annotations

import signal

import pytest
from django.conf import settings

from common.services import PLATFORM_SECRETS
from engine.runtime.cli import build_parser, rendezvous
from engine.runtime.confine import SERVER_PATH
from engine.runtime.spec import parse_spec
from jobs.confinement import uploads_dir
from jobs.launch import HostShare, engine_command, kill_group, run_dir, scrub_paths, start_engine
from jobs.models import Job

pytestmark = pytest.mark.django_db

def test_the_engine_gets_no_secret_key_admin_password_or_database_url(
        user, small_spec, monkeypatch):
    for name in PLATFORM_SECRETS:
        monkeypatch.setenv(name, f"secret-{name}")
    job = Job.objects.create(name="env", owner=user, spec=small_spec)
    proc = start_engine(job, job.spec)
    try:
        # Popen returns once the launcher has exec'd: this is the environment it runs with
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            names = {item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item}
    finally:
        kill_group(proc, signal.SIGKILL)
        proc.wait()
    assert not names & set(PLATFORM_SECRETS)
    assert {"PATH", "PYTHONPATH"} <= names  # what it does need is still there

def test_each_hosts_launcher_is_told_its_node_rank_and_only_the_placements_lead_leads(
        user, small_spec, tmp_path, monkeypatch):
    """The platform chose the lead (node rank 0, the rendezvous endpoint's host); the engine
    takes that choice from its command line rather than working it out again."""
    # the hosts' addresses are not this machine's: gloo's interface is named, not looked up
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    small_spec["parallel"] = {"nodes": 2, "hosts": 2}
    job = Job.objects.create(name="hosts", owner=user, spec=small_spec)
    for node_rank in (0, 1):
        share = HostShare(node_rank=node_rank, nnodes=2, endpoint="10.0.0.1:29500",
                          run_id=f"job{job.pk}-0", address=f"10.0.0.{node_rank + 1}")
        command = engine_command(job, tmp_path / "spec.json", share)
        args = build_parser().parse_args(command[command.index("engine.train") + 1:])
        assert rendezvous(args, parse_spec(small_spec)).node_rank == node_rank

def test_paths_outside_the_jobs_own_folders_are_replaced(user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    own, upload = run_dir(job) / "checkpoints" / "step-000002", uploads_dir(user) / "d.jsonl"
    tail = (f'File "{settings.REPO_ROOT}/engine/runtime/data.py", line 3, in load\n'
            f"FileNotFoundError: /etc/ringside/secret (from {own}/MANIFEST.json)\n"
            f"train.dataset.paths: {upload}:7 is not JSON; "
            f"{run_dir(job)}/../7/checkpoints; s3://bucket/x; loss 0.5/step")
    assert scrub_paths(tail, job) == (
        f'File "{SERVER_PATH}", line 3, in load\n'
        f"FileNotFoundError: {SERVER_PATH} (from {own}/MANIFEST.json)\n"
        f"train.dataset.paths: {upload}:7 is not JSON; "
        f"{SERVER_PATH}; s3://bucket/x; loss 0.5/step")

"""Slurm through its REST API, `slurmrestd`, where the operator sets RINGSIDE_SLURMRESTD_URL
(jobs.backends.slurm's `Slurm`, the same calls its clients make): a login node then needs
neither Slurm's clients nor its configuration, only slurmrestd's address and a JWT.

It speaks the API Slurm 22.05 serves, v0.0.38 (`slurmrestd -s openapi/v0.0.38`), as the user
RINGSIDE_SLURMRESTD_USER with the token RINGSIDE_SLURMRESTD_TOKEN (`scontrol token`; the
jobs run as that user). slurmrestd reads no `#SBATCH` line: the options of the batch script go
beside it as the job descriptor (`descriptor`, from the same `sbatch_options`), with the
environment sbatch would have passed on. Where it differs from the clients:

- the time limit's warning: slurmrestd 22.05 refuses `B:` in `signal` (only sbatch may ask
  for the batch shell alone), and a warning to the job's steps would kill the launchers, so
  the descriptor asks for none (`warns_of_time_limit` is False). `look` reports instead when
  a running job's time limit ends it (`end_time`), and the platform runs the batch script's
  warning itself that long before (jobs.backends.slurm_run), as often as it looks
  (RINGSIDE_SLURM_POLL_S) rather than at Slurm's 30 s check.
- a job is known only while the controller remembers it (MinJobAge, 300 s by default; the
  platform looks every RINGSIDE_SLURM_POLL_S): there is no accounting (`sacct`) to fall back
  on without slurmdbd.
- the configuration is not shown: how soon a silent node is marked down is the setting
  RINGSIDE_SLURM_NODE_DOWN_WITHIN_S (default: from Slurm's default timeouts).

The partitions' limits (`partitions`) come from `GET /partitions`, so with slurmrestd the web
server checking a job's options needs no `scontrol` either.

Every refusal or failure is a SlurmError with slurmrestd's own words (its `errors`), the HTTP
status, or why it could not be reached.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from common.services import engine_env
from jobs.backends.slurm_calls import (
    ALIVE,
    CLIENT_TIMEOUT_S,
    SLURM_DEFAULTS,
    Partition,
    Seen,
    SlurmError,
    down_within_s,
)

API = "v0.0.38"
# each option of the batch script, by sbatch's long name, and its name in slurmrestd's job
# descriptor (which takes sbatch's options by these names and parses their values as sbatch
# does)
REST_NAMES = {"job-name": "name", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
              "signal": "signal", "requeue": "requeue", "output": "standard_output",
              "error": "standard_error", "open-mode": "open_mode",
              "chdir": "current_working_directory", "gres": "gres",
              "cpus-per-task": "cpus_per_task", "time": "time_limit", "partition": "partition",
              "account": "account", "qos": "qos", "constraint": "constraints",
              "exclude": "exclude_nodes"}
# sbatch's options slurmrestd 22.05 cannot take as sbatch does (see the module's docstring)
NOT_SENT = frozenset({"signal"})
# what slurmrestd 22.05 answers when the controller refused its token (it passes the request's
# token on, SLURM_JWT=daemon, and reports the refusal no better)
REFUSED_TOKEN = ("Unspecified error", "Zero Bytes were transmitted or received")
# the node states and flags sinfo shows as down, failed, drained (draining) or not responding
LOST_STATES = frozenset({"down"})
LOST_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING"})
UNLIMITED = -1  # slurmrestd's word for a partition's INFINITE limit


def descriptor(options: dict[str, str | bool], environment: dict[str, str]) -> dict[str, Any]:
    """slurmrestd's job descriptor for the batch script's `options` (by sbatch's names, as
    jobs.backends.slurm.sbatch_options gives them), with the job's `environment`."""
    return {**{REST_NAMES[name]: value for name, value in options.items()
               if name not in NOT_SENT}, "environment": environment}


def exit_code(status: int) -> int:
    """slurmrestd's exit code (the batch shell's wait status) as a process's return code (a
    signal's as its negative), as jobs.backends.slurm.exit_code reads the clients'."""
    return -(status & 0x7F) if status & 0x7F else status >> 8


def limit(value: int | None) -> int | None:
    """A partition's limit as slurmrestd gives it (nodes, minutes); None: unlimited."""
    return None if value in (None, UNLIMITED) else value


class SlurmRest:
    """One slurmrestd, as one user."""

    warns_of_time_limit = False  # see the module's docstring

    def __init__(self, url: str, user: str, token: str):
        self.url, self.user, self.token = url.rstrip("/"), user, token

    @classmethod
    def from_settings(cls) -> SlurmRest:
        return cls(settings.SLURMRESTD_URL, settings.SLURMRESTD_USER, settings.SLURMRESTD_TOKEN)

    def submit(self, script: Path, options: dict[str, str | bool]) -> str:
        body = {"script": script.read_text(encoding="utf-8"),
                "job": descriptor(options, engine_env())}
        answer = self._call("POST", "/job/submit", json=body)
        if answer.get("job_id") is None:
            raise SlurmError(f"slurmrestd at {self.url}: no job id in its answer: {answer}")
        return str(answer["job_id"])

    def look(self, slurm_id: str) -> Seen:
        """What the controller says of the job (`GET /job/<id>`), as the clients report it:
        its nodes only while it may still run (as names: slurmrestd lists each allocated
        node), its reason "None" where it has none; and, while it runs, when its time limit
        ends it."""
        jobs = self._call("GET", f"/job/{slurm_id}").get("jobs") or []
        if not jobs:
            raise SlurmError(f"slurmrestd at {self.url}: Slurm job {slurm_id}: not found")
        job = jobs[0]
        state = job["job_state"]
        if state not in ALIVE:
            return Seen(state, job.get("state_reason") or "", exit_code(job["exit_code"]))
        allocated = (job.get("job_resources") or {}).get("allocated_nodes") or []
        return Seen(state, job.get("state_reason") or "", 0,
                    ",".join(node["nodename"] for node in allocated),
                    float(job["end_time"]) if state == "RUNNING" and job.get("end_time")
                    else None)

    def hostnames(self, nodes: str) -> list[str]:
        """The names in a node list `look` gave (slurmrestd has no call that expands one)."""
        return nodes.split(",") if nodes else []

    def cancel(self, slurm_id: str, sig: signal.Signals | None = None) -> None:
        """`DELETE /job/<id>` signals the whole job (its batch shell and steps, as
        `scancel --full`); SIGKILL, its default, cancels it."""
        params = {"signal": sig.name.removeprefix("SIG")} if sig is not None else {}
        self._call("DELETE", f"/job/{slurm_id}", params=params)

    def lost_nodes(self, nodes: list[str]) -> list[str]:
        if not nodes:
            return []
        known = self._call("GET", "/nodes").get("nodes") or []
        return sorted(node["name"] for node in known if node["name"] in nodes and (
            node.get("state") in LOST_STATES or LOST_FLAGS & set(node.get("state_flags") or [])))

    def node_down_within_s(self) -> float:
        """RINGSIDE_SLURM_NODE_DOWN_WITHIN_S: slurmrestd does not show the configuration."""
        return settings.SLURM_NODE_DOWN_WITHIN_S or down_within_s(SLURM_DEFAULTS)

    def partitions(self) -> list[Partition]:
        """`GET /partitions`."""
        return [Partition(p["name"], "default" in (p.get("flags") or []),
                          limit(p.get("maximum_nodes_per_job")), limit(p.get("max_time_limit")))
                for p in self._call("GET", "/partitions").get("partitions") or []]

    def _call(self, method: str, path: str, **request: Any) -> dict[str, Any]:
        """slurmrestd's answer to one request; SlurmError with its words if it refused it or
        failed, or if it could not be reached."""
        where = f"slurmrestd at {self.url}: {method} {path}"
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token}
        try:
            response = httpx.request(method, f"{self.url}/slurm/{API}{path}", headers=headers,
                                     timeout=CLIENT_TIMEOUT_S, **request)
        except httpx.HTTPError as error:
            raise SlurmError(f"{where}: {type(error).__name__}: {error or 'no answer'}") from error
        try:
            answer = response.json()
        except ValueError:  # an authentication failure, say, is plain text
            answer = {}
        errors = answer.get("errors") or []
        if response.is_success and not errors:
            return answer
        said = "; ".join(filter(None, (
            " ".join(filter(None, (e.get("error"), e.get("description") and
                                   f"({e['description']})"))) for e in errors)))
        said = said or response.text.strip() or "no message"
        if response.status_code == httpx.codes.UNAUTHORIZED or any(
                e.get("error") in REFUSED_TOKEN for e in errors):
            said += (f" (so slurmrestd reports the controller refusing user {self.user!r}'s "
                     "token: check RINGSIDE_SLURMRESTD_USER and RINGSIDE_SLURMRESTD_TOKEN)")
        raise SlurmError(f"{where}: HTTP {response.status_code}: {said}")


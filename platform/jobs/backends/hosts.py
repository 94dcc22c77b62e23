"""The `hosts` backend: Ringside's own worker hosts (`manage.py worker`). Placement reserves
slots on them (jobs.placement); the lead host's supervisor starts its engine launcher and sends
every other host its part (jobs.membership), which beat and watch each other."""

from __future__ import annotations

from engine.contract import free_port
from jobs import placement
from jobs.dispatch import send_run_part
from jobs.launch import EngineProcess, run_dir, start_engine
from jobs.membership import Peers, announce, held, incarnation_spec, share
from jobs.models import Job


class HostsBackend:
    def start(self, job: Job) -> tuple[EngineProcess, Peers | None]:
        """Start this incarnation: the lead's engine launcher, then every other host's part."""
        reservations = held(job, job.incarnation)
        if not reservations:  # run directly, not placed (the engine's own single-host launch)
            return start_engine(job, job.spec), None
        announce(job, run_dir(job) / "events.jsonl")
        endpoint = (f"{reservations[0].host.address}:{free_port()}" if len(reservations) > 1
                    else "")
        proc = start_engine(job, incarnation_spec(job, len(reservations)),
                            share(job, job.incarnation, 0, endpoint))
        for reservation in reservations[1:]:
            send_run_part(job, reservation, endpoint)
        return proc, Peers(job, job.incarnation, 0)

    def release(self, job: Job) -> None:
        placement.release(job)


BACKEND = HostsBackend()

"""All ranks agree: anomalies found on any rank reach every rank with their evidence, and
the ladder then decides the same actions everywhere. Four real gloo ranks."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.anomaly import Detectors, ResponseLadder, agree_anomalies

WORLD, NAN_RANK, NAN_STEP = 4, 3, 5


def rank_main(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    detectors, ladder = Detectors(rank=rank), ResponseLadder()
    log = []
    for step in range(1, 9):
        loss = 3.0 - 0.01 * step + 0.001 * rank  # each rank's own micro-batch loss
        if rank == NAN_RANK and step in (NAN_STEP, NAN_STEP + 1):
            loss = float("nan")
        agreed, now = agree_anomalies(detectors.check_step(step, loss=loss))
        decisions = ladder.decide(agreed, step, now)
        log.append({"step": step, "now": now,
                    "anomalies": [[a.kind, a.rank, a.evidence] for a in agreed],
                    "actions": [d.event_fields() for d in decisions]})
    with open(f"{out}/log-{rank}.json", "w") as f:
        json.dump(log, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("agree")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(port, str(out)), nprocs=WORLD, start_method="fork")
    return [json.loads((out / f"log-{r}.json").read_text()) for r in range(WORLD)]


def test_every_rank_sees_the_same_anomalies_clock_and_decisions(logs):
    assert all(log == logs[0] for log in logs)


def test_an_anomaly_on_one_rank_reaches_all_with_its_rank_and_evidence(logs):
    by_step = {entry["step"]: entry for entry in logs[0]}
    assert by_step[NAN_STEP]["anomalies"] == [
        ["nan", NAN_RANK, {"loss": "nan", "threshold": "finite"}]]
    assert [a["action"] for a in by_step[NAN_STEP]["actions"]] == ["skip_update"]
    assert [a["action"] for a in by_step[NAN_STEP + 1]["actions"]] == ["rollback"]
    quiet = [e for s, e in by_step.items() if s not in (NAN_STEP, NAN_STEP + 1)]
    assert all(e["anomalies"] == [] and e["actions"] == [] for e in quiet)

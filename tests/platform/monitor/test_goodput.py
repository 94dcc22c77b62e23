"""The goodput ledger (monitor.goodput): every second of a job's wall clock goes to productive
training or to one cause of loss, from stored events and transitions (real database rows, as
the ingest and the state machine write them)."""

import random
import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from engine.contract import parse_event
from jobs.models import Job, JobEvent
from monitor import goodput
from monitor.goodput import CAUSES, HOUR, straggler_wait
from monitor.ingest import store_events
from monitor.models import Event, Goodput

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_700_002_800.0  # on an hour's start


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=UTC)


@pytest.fixture
def job(job) -> Job:
    """The shared job (conftest), created at T0."""
    Job.objects.filter(pk=job.pk).update(created_at=at(0))
    return job


class Timeline:
    """Writes a job's history as the platform stores it: transitions as JobEvent rows (each
    folded as it is written), engine events through the ingest's storage."""

    def __init__(self, job: Job):
        self.job, self.seq = job, 0
        self.state = "queued"

    def move(self, t: float, to: str, cause: str = "worker") -> JobEvent:
        row = JobEvent.objects.create(job=self.job, from_state=self.state, to_state=to,
                                      cause=cause, time=at(t))
        self.state = to
        return row

    def emit(self, t: float, type: str, step: int = 0, **fields) -> int:
        self.seq += 1
        store_events(self.job.pk, [{"type": type, "job": str(self.job.pk), "step": step,
                                    "time": T0 + t, "seq": self.seq, **fields}])
        return self.seq

    def state_event(self, t: float, state: str, **fields) -> int:
        return self.emit(t, "state", state=state, **fields)

    def step(self, t: float, step: int, step_time: float = 1.0, **fields) -> int:
        return self.emit(t, "step", step, loss=2.0, grad_norm=1.0, lr=1e-3, tokens_per_s=1e3,
                         step_time=step_time, tokens=100 * step, memory={}, **fields)

    def ops(self, t: float, step: int, compute_ms: list[float],
            data_wait_share: float = 0.0) -> int:
        return self.emit(t, "ops", step, step_ms=1000.0, void_share=0.0,
                         data_wait_share=data_wait_share,
                         ops={}, ranks=[{"rank": r, "compute_ms": ms}
                                        for r, ms in enumerate(compute_ms)])

    def checkpoint(self, t: float, step: int, blocking_s: float) -> int:
        return self.emit(t, "checkpoint", step, path=f"/ckpt/{step}", tier="disk",
                         blocking_s=blocking_s, size_bytes=1, strategy="NNN", world_size=2)

    def action(self, t: float, action: str, by: str, step: int = 0) -> int:
        return self.emit(t, "action", step, action=action, by=by)

    def anomaly(self, t: float, kind: str, step: int = 0) -> int:
        return self.emit(t, "anomaly", step, kind=kind, severity="error")


def seconds(ledger: dict) -> dict[str, float]:
    return {cause: round(entry["seconds"], 6) for cause, entry in ledger["causes"].items()}


def a_full_run(job: Job) -> dict[str, list]:
    """Queued, started, a straggling step, an evaluation, checkpoints, a loss spike rolled back
    by the policy, a crash restarted by the engine, a warm and a cold pause, completion; returns
    what each cause should refer to."""
    tl, refs = Timeline(job), {}
    refs["queue"] = [tl.move(10, "starting").pk]
    tl.state_event(12, "starting")
    refs["startup"] = [tl.state_event(15, "running")]
    tl.move(15.5, "running", "engine")  # made while the engine runs: its events say more
    tl.step(16, 1)
    # 0.3 s waited for rank 0, 0.1 s for the next batch
    refs["straggler"] = refs["data"] = [tl.ops(16.01, 1, [500.0, 200.0], data_wait_share=0.1)]
    refs["eval"] = [tl.step(17, 2, step_time=0.6, eval_loss=2.1)]
    refs["checkpoint"] = [tl.checkpoint(17.5, 2, 0.3)]
    tl.step(18.5, 3)
    tl.step(19.5, 4)
    tl.anomaly(20.4, "loss_spike", 5)
    refs["skipped"] = [tl.action(20.5, "rollback", "policy", 5)]
    refs["retrained"] = [tl.step(21.5, 3), tl.step(22.5, 4)]
    tl.step(23.5, 5)
    refs["recovery"] = [tl.anomaly(26, "crash", 5), tl.action(26, "restart", "policy", 5)]
    refs["recovery"].append(tl.state_event(28, "running"))
    refs["retrained"] += [tl.step(29, 3), tl.step(30, 4), tl.step(31, 5)]
    tl.step(32, 6)
    refs["pause"] = [tl.action(32.2, "pause", "command", 6), tl.state_event(32.3, "paused"),
                     tl.state_event(40.1, "running", mode="warm")]
    tl.action(40, "resume", "command", 6)
    tl.step(41.1, 7)
    refs["checkpoint"].append(tl.checkpoint(41.5, 7, 0.2))
    refs["pause"] += [tl.action(41.6, "pause", "command", 7), tl.state_event(42, "paused")]
    refs["pause_transitions"] = [tl.move(43, "paused", "engine").pk]
    refs["pause_transitions"].append(tl.move(50, "queued", "user").pk)
    refs["queue_transitions"] = [tl.move(53, "starting").pk]
    tl.state_event(56, "running")
    tl.step(57, 8)
    refs["checkpoint"].append(tl.checkpoint(57.3, 8, 0.3))
    refs["startup"].append(tl.state_event(58, "completed"))
    tl.move(58.5, "completing", "engine")
    refs["startup_transitions"] = [tl.move(59, "completed").pk]
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=at(59))
    return refs


EXPECTED = {"productive": 7.6, "queue": 13.0, "startup": 9.7, "checkpoint": 0.8,
            "recovery": 4.5, "retrained": 5.0, "skipped": 1.0, "straggler": 0.3, "data": 0.1,
            "pause": 16.6, "eval": 0.4}


def test_every_cause_gets_the_seconds_its_events_bound_and_they_add_up_to_the_wall_clock(job):
    a_full_run(job)
    ledger = goodput.current(job.pk)
    assert seconds(ledger) == EXPECTED
    assert ledger["wall_s"] == pytest.approx(59.0)
    assert ledger["closed"] and ledger["open"] is None
    assert sum(e["seconds"] for e in ledger["causes"].values()) == pytest.approx(59.0)
    assert ledger["productive_s"] == pytest.approx(7.6)
    assert ledger["goodput"] == pytest.approx(7.6 / 59)
    assert sum(e["share"] for e in ledger["causes"].values()) == pytest.approx(1.0)
    assert list(ledger["causes"]) == list(CAUSES)  # productive first, then the losses


def test_each_cause_refers_to_the_events_and_transitions_behind_it(job):
    refs = a_full_run(job)
    causes = goodput.current(job.pk)["causes"]
    for cause in ("startup", "straggler", "data", "eval", "checkpoint", "skipped", "retrained",
                  "recovery", "pause"):
        assert set(refs[cause]) <= set(causes[cause]["events"]), cause
    assert set(refs["pause_transitions"]) <= set(causes["pause"]["transitions"])
    assert set(refs["queue"] + refs["queue_transitions"]) <= set(causes["queue"]["transitions"])
    assert set(refs["startup_transitions"]) <= set(causes["startup"]["transitions"])


def test_the_ledger_kept_as_events_arrive_is_the_one_folded_afresh_from_what_is_stored(job):
    a_full_run(job)
    assert goodput.stored(job.pk).to_dict() == goodput.rebuild(job.pk).to_dict()


def test_a_live_job_accrues_the_time_since_its_last_event_to_what_it_is_doing_now(job):
    tl = Timeline(job)
    tl.move(10, "starting")
    tl.state_event(14, "running")
    tl.step(15, 1)
    ledger = goodput.current(job.pk, now=T0 + 15.5)
    assert ledger["open"] == "productive" and not ledger["closed"]
    assert ledger["wall_s"] == pytest.approx(15.5)
    assert seconds(ledger) == {**dict.fromkeys(CAUSES, 0.0), "queue": 10.0, "startup": 4.0,
                               "productive": 1.5}
    tl.action(16, "pause", "command", 1)
    assert goodput.current(job.pk, now=T0 + 20)["open"] == "pause"


def test_a_requeue_after_a_lost_worker_is_recovery_until_the_engine_runs_again(job):
    tl = Timeline(job)
    tl.move(1, "starting")
    tl.state_event(2, "running")
    tl.step(3, 1)
    tl.move(10, "queued", "worker_loss")
    tl.move(12, "starting")
    tl.state_event(15, "running")
    tl.step(16, 2)
    tl.state_event(17, "failed")
    tl.move(18, "failed", "engine")
    assert seconds(goodput.current(job.pk)) == {
        **dict.fromkeys(CAUSES, 0.0), "queue": 1.0, "startup": 1.0, "productive": 2.0,
        "recovery": 14.0}


def test_skipped_and_retried_updates_are_the_steps_the_policy_dropped(job):
    tl = Timeline(job)
    tl.move(0, "starting")
    tl.state_event(1, "running")
    tl.step(2, 1)
    tl.action(3, "skip_update", "policy", 2)
    tl.action(4.5, "retry_step", "policy", 2)
    tl.action(4.7, "observe", "policy", 2)  # changes nothing: no boundary
    tl.step(5.5, 2)  # the step number trained at last: not trained before
    causes = seconds(goodput.current(job.pk, now=T0 + 5.5))
    assert (causes["skipped"], causes["productive"], causes["retrained"]) == (2.5, 2.0, 0.0)


def test_straggler_wait_is_the_slowest_ranks_compute_over_the_median_of_the_others():
    assert straggler_wait([{"compute_ms": 100}, {"compute_ms": 400}, {"compute_ms": 120},
                           {"compute_ms": 110}]) == pytest.approx(0.29)
    assert straggler_wait([{"compute_ms": 100}]) == 0.0
    assert straggler_wait([]) == 0.0


def test_seconds_are_counted_per_hour_so_a_range_takes_only_its_hours(job):
    tl = Timeline(job)
    tl.move(HOUR + 600, "starting")  # queued across the hour's end
    ledger = goodput.stored(job.pk)
    later = T0 + 2 * HOUR + 300  # starting since HOUR + 600
    assert ledger.within(T0, T0 + HOUR, later)["queue"] == pytest.approx(HOUR)
    assert ledger.within(T0 + HOUR, T0 + 2 * HOUR, later) == pytest.approx({
        **dict.fromkeys(CAUSES, 0.0), "queue": 600, "startup": HOUR - 600})
    assert ledger.within(T0, T0 + 3 * HOUR, later) == pytest.approx({
        **dict.fromkeys(CAUSES, 0.0), "queue": HOUR + 600, "startup": HOUR - 300})


def test_a_redelivered_batch_and_an_event_stored_late_change_nothing(job):
    tl = Timeline(job)
    tl.move(1, "starting")
    tl.state_event(2, "running")
    seq = tl.step(3, 1)
    before = goodput.stored(job.pk).to_dict()
    goodput.fold_events(job.pk, [])
    goodput.fold_events(job.pk, [parse_event(Event.objects.get(job=job, seq=seq).data)])
    assert goodput.stored(job.pk).to_dict() == before
    tl.step(2.5, 1)  # from an engine the reaper gave up on, stored after newer ones
    assert goodput.stored(job.pk).seconds == before["seconds"]


def test_a_job_without_a_kept_ledger_gets_one_from_what_is_stored(job):
    a_full_run(job)
    Goodput.objects.filter(job=job).delete()
    assert seconds(goodput.current(job.pk)) == EXPECTED


def _waiting_on_a_lock() -> bool:
    """Another connection to this test database waits on a lock (read afresh: in a
    transaction the statistics are otherwise those of its first read)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0] > 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite takes no row locks: "
                    "its writers are one at a time")
def test_a_ledger_read_first_beside_the_jobs_first_transition_makes_it_once_without_deadlock(job):
    """A page's first read of the ledger makes its row while the supervisor's start (which
    holds the job's row) makes it too: the reader waits for the start and reads its row."""
    Goodput.objects.filter(job=job).delete()
    locked, failures = threading.Event(), []

    def start() -> None:
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=job.pk)
            locked.set()
            deadline = time.monotonic() + 30
            while not _waiting_on_a_lock() and time.monotonic() < deadline:
                time.sleep(0.05)
            job.transition("starting", "worker")

    def read() -> None:
        locked.wait(30)
        goodput.stored(job.pk)

    def on_its_own_connection(call) -> threading.Thread:
        def run() -> None:
            try:
                call()
            except Exception as e:  # noqa: BLE001 (reported by the test's thread)
                failures.append(e)
            finally:
                connection.close()
        return threading.Thread(target=run)

    threads = [on_its_own_connection(start), on_its_own_connection(read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert Job.objects.get(pk=job.pk).state == "starting"
    assert Goodput.objects.filter(job=job).count() == 1


# -- the API -------------------------------------------------------------------------------

def test_the_api_serves_a_jobs_ledger_to_its_owner_only(api, job, other_user, small_spec):
    a_full_run(job)
    ledger = api.get(f"/api/jobs/{job.pk}/goodput/").json()
    assert ledger["job"] == job.pk and seconds(ledger) == EXPECTED
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    assert api.get(f"/api/jobs/{theirs.pk}/goodput/").status_code == 404


def test_each_cause_links_to_the_stored_events_and_transitions_behind_it(api, job):
    refs = a_full_run(job)
    body = api.get(f"/api/jobs/{job.pk}/goodput/events/?cause=pause").json()
    assert body["cause"] == "pause"
    assert {e["seq"] for e in body["events"]} >= set(refs["pause"])
    assert [e["type"] for e in body["events"]].count("action") == 2  # the two pauses
    assert [t["to_state"] for t in body["transitions"]] == ["paused", "queued"]
    bad = api.get(f"/api/jobs/{job.pk}/goodput/events/?cause=lunch")
    assert bad.status_code == 400 and "cause" in bad.json()


def test_the_summary_sums_the_users_jobs_over_the_hours_asked(api, job, user, small_spec):
    a_full_run(job)  # in T0's hour
    later = Job.objects.create(name="later", owner=user, spec=small_spec)
    Job.objects.filter(pk=later.pk).update(created_at=at(2 * HOUR))
    tl = Timeline(Job.objects.get(pk=later.pk))
    tl.move(2 * HOUR + 30, "cancelled", "user")
    since, until = at(0).isoformat(), at(HOUR - 1).isoformat()
    body = api.get("/api/goodput/", {"since": since, "until": until}).json()
    assert (body["since"], body["until"]) == (T0, T0 + HOUR)
    assert [j["id"] for j in body["jobs"]] == [job.pk]
    assert body["wall_s"] == pytest.approx(59.0) and body["goodput"] == pytest.approx(7.6 / 59)
    assert {c: round(e["seconds"], 6) for c, e in body["causes"].items()} == EXPECTED
    both = api.get("/api/goodput/", {"since": since, "until": at(3 * HOUR).isoformat()}).json()
    assert [j["id"] for j in both["jobs"]] == [job.pk, later.pk]
    assert both["causes"]["queue"]["seconds"] == pytest.approx(13.0 + 30.0)


@pytest.mark.parametrize(("query", "field"), [
    ({"since": "yesterday"}, "since"),
    ({"until": "2024-13-01T00:00:00Z"}, "until"),
    ({"since": "2024-01-02T00:00:00Z", "until": "2024-01-01T00:00:00Z"}, "until"),
])
def test_a_bad_summary_range_is_a_400_naming_the_field(api, query, field):
    response = api.get("/api/goodput/", query)
    assert response.status_code == 400 and field in response.json()


def test_the_summary_needs_authentication(client):
    assert client.get("/api/goodput/").status_code in (401, 403)


def gauges(text: str) -> dict[str, float]:
    """`{'name{labels}': value}` of Prometheus text (its samples, comments left out)."""
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_the_ledgers_are_prometheus_gauges_of_the_users_recent_jobs(api, job, user, other_user,
                                                                     small_spec):
    a_full_run(job)  # finished long ago: no longer exported
    live = Job.objects.create(name='say "hi"', owner=user, spec=small_spec)
    JobEvent.objects.create(job=live, from_state="queued", to_state="starting", cause="worker")
    Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    response = api.get("/api/goodput/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert "# TYPE ringside_goodput_seconds gauge" in text
    exported = gauges(text)
    labels = f'job="{live.pk}",name="say \\"hi\\"",owner="ada"'
    assert exported[f'ringside_goodput_seconds{{{labels},cause="productive"}}'] == 0.0
    assert exported[f"ringside_goodput_ratio{{{labels}}}"] == 0.0
    assert exported[f"ringside_goodput_wall_seconds{{{labels}}}"] > 0
    assert f'job="{job.pk}"' not in text and "theirs" not in text

    Job.objects.filter(pk=job.pk).update(finished_at=datetime.now(UTC))  # ended just now
    exported = gauges(api.get("/api/goodput/metrics/").content.decode())
    mine = f'job="{job.pk}",name="t",owner="ada"'
    assert {cause: exported[f'ringside_goodput_seconds{{{mine},cause="{cause}"}}']
            for cause in CAUSES} == pytest.approx(EXPECTED)


def test_whatever_the_history_productive_and_the_losses_add_up_to_the_wall_clock():
    """Marks of every kind, in any order (late ones too), in random histories: the seconds
    always add up to the time from the start to the cursor, and none is negative."""
    from monitor.goodput import Mark, build

    rng = random.Random(22)
    kinds = [dict(kind="step", step_time=0.5), dict(kind="step", evaluated=True),
             dict(kind="ops", wait_s=0.3), dict(kind="checkpoint", blocking_s=0.4),
             *[dict(kind="state", state=s) for s in ("running", "paused", "completed",
                                                     "failed", "resharding", "starting")],
             *[dict(kind="action", action=a, by=b) for a in ("pause", "restart", "rollback",
                                                             "skip_update", "crash", "observe")
               for b in ("policy", "command")],
             *[dict(kind="transition", state=s, cause=c)
               for s in ("queued", "starting", "paused", "waiting_for_hosts", "running")
               for c in ("user", "worker_loss", "policy")]]
    for _ in range(200):
        marks = [Mark(time=T0 + rng.uniform(-5, 100), seq=i, transition=i,
                      step=rng.randint(1, 20), **rng.choice(kinds)) for i in range(60)]
        ledger = build(T0, marks[:40]).fold(marks[40:])  # the rest arriving late, unsorted
        assert min(ledger.seconds.values()) >= -1e-9
        assert sum(ledger.seconds.values()) == pytest.approx(ledger.cursor - T0)

"""Property test of the REST API against its own OpenAPI schema: schemathesis generates
requests from /api/schema/ (valid ones and deliberately invalid ones), sends them to the WSGI
application as a user with an API token, and checks that no answer is a 5xx, that every status
code is one the schema documents for the operation, and that every body matches its schema.

The user owns one running job carrying the events of a real engine run (steps, op timings,
expert load, checkpoints, an anomaly and the fault policy's action), and every generated job id
is pointed at it, so the reads serialise real rows and the commands meet a live state machine.

Nothing is excluded. Each operation runs in a test transaction that is rolled back, so the
`transaction.on_commit` hooks never fire: creating, cloning or resuming a job queues no
training, and no command is put on an engine's control stream.
"""

import json
import subprocess
import sys

import pytest
import schemathesis
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from engine.runtime.spec import parse_spec
from jobs.models import ApiToken, Job
from monitor.ingest import store_events

pytestmark = pytest.mark.django_db

schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())

# a nano run long enough for every kind of stored row: checkpoints every 2 steps, and a NaN
# loss at step 5 that the engine's fault policy answers
RUN_SPEC = {"name": "fuzz", "model": {"preset": "nano"},
            "train": {"steps": 8, "micro_batch": 2, "seq_len": 32, "eval_every": 0,
                      "threads": 1},
            "checkpoint": {"every": 2},
            "faults": {"inject": [{"kind": "nan", "step": 5}]}}
EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def engine_events(tmp_path_factory) -> list[dict]:
    run = tmp_path_factory.mktemp("fuzz-run")
    spec_path = run / "spec.json"
    spec_path.write_text(json.dumps(RUN_SPEC))
    subprocess.run([sys.executable, "-m", "engine.train", str(spec_path), "--run-dir",
                    str(run / "run")], check=True, capture_output=True, timeout=120)
    events = [json.loads(line) for line in (run / "run" / "events.jsonl").open()]
    assert {"step", "ops", "experts", "checkpoint", "anomaly", "action"} <= {
        e["type"] for e in events}
    return events


@pytest.fixture
def requests_keep_the_test_transaction():
    """Django's handler closes the database connection around each request, which would end
    the test's transaction; its own test client disconnects that handler the same way."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fresh_throttles():
    """The login throttle counts in the process's cache: start and leave it empty."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def running_job(user, engine_events) -> Job:
    job = Job.objects.create(name="fuzz", owner=user, spec=parse_spec(RUN_SPEC).to_dict())
    job.start(supervisor="fuzz")
    job.mark_running()
    store_events(job.pk, [{**e, "job": str(job.pk)} for e in engine_events])
    return job


@pytest.fixture
def token_header(user, requests_keep_the_test_transaction, fresh_throttles) -> dict[str, str]:
    return {"Authorization": f"Token {ApiToken.objects.create(user=user, name='fuzz').key}"}


@schema.parametrize()
# derandomize: the same examples on every run, so a failure reproduces and `make test` is stable
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_request_gets_a_server_error_or_an_answer_outside_the_schema(case, token_header,
                                                                        running_job):
    for name, value in case.path_parameters.items():
        if case.path.startswith("/api/jobs/{") and str(value).isdigit():  # a job id
            case.path_parameters[name] = running_job.pk
    case.call_and_validate(headers=token_header, checks=[
        not_a_server_error, status_code_conformance, response_schema_conformance])

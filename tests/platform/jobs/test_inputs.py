"""What the API refuses before it acts: a spec field past its bound (each field of the bounds
table at its limit is accepted, one past it is a 400 naming it), a body that is not JSON (415)
and a body over the upload limit (413), each answered in JSON."""

import json

import pytest
from django.conf import settings

from engine.runtime.spec import SPEC_BOUNDS
from jobs.models import Job

pytestmark = pytest.mark.django_db

# Fields other checks tie a bounded field to, set so that only the bound decides
COMPANIONS = {
    "train.seq_len": {"model.max_position_embeddings": SPEC_BOUNDS["train.seq_len"]},
    "model.num_key_value_heads": {"model.num_attention_heads": 1024},
    "model.num_experts_per_tok": {"model.num_experts": 4096},
    "model.n_group": {"model.num_experts": 4096},
    "model.topk_group": {"model.num_experts": 4096, "model.n_group": 256},
    "model.first_k_dense_replace": {"model.num_hidden_layers": 1024},
    "parallel.hosts": {"parallel.nodes": SPEC_BOUNDS["parallel.hosts"]},  # hosts divide nodes
}
# a concrete field for each "*" of the table
CONCRETE = {"faults.inject.*.factor": "faults.inject.0.factor",
            "faults.policy.thresholds.*.*": "faults.policy.thresholds.loss_spike.z"}


def spec_with(path: str, value: float) -> dict:
    spec = {"name": "bounds", "model": {"preset": "nano"}, "train": {"steps": 10},
            "faults": {"inject": [{"kind": "loss_spike", "step": 1}]}}
    for field, v in {**COMPANIONS.get(path, {}), CONCRETE.get(path, path): value}.items():
        *parents, last = field.split(".")
        node = spec
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = v
    return spec


# admission refuses a model no registered host can hold: with none registered (the session
# worker's host, when an earlier test of this process started it, hidden) it takes every size
@pytest.mark.usefixtures("session_worker_host_hidden")
@pytest.mark.parametrize("path, most", sorted(SPEC_BOUNDS.items()))
def test_every_bounded_spec_field_takes_its_limit_and_refuses_one_past_it(api, path, most):
    at_limit = api.post("/api/jobs/", spec_with(path, most), format="json")
    assert at_limit.status_code == 201, at_limit.json()
    past = api.post("/api/jobs/", spec_with(path, most + 1), format="json")
    assert past.status_code == 400
    field = CONCRETE.get(path, path)
    assert past.json()["errors"][field] == f"must be at most {most}"


@pytest.mark.parametrize("path", ["/api/jobs/", "/api/jobs/{job}/checkpoint/",
                                  "/api/jobs/{job}/rollback/"])
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=xyz"])
def test_a_form_body_is_415_naming_json(api, user, small_spec, path, content_type):
    job = Job.objects.create(name="j", owner=user, spec=small_spec)
    response = api.generic("POST", path.format(job=job.pk), "steps=10",
                           content_type=content_type)
    assert response.status_code == 415
    detail = response.json()["detail"]
    assert detail.startswith("Unsupported media type") and detail.endswith("application/json")


def test_the_token_login_the_cli_uses_still_takes_json(user):
    from rest_framework.test import APIClient

    response = APIClient().post("/api/auth/token/", {"username": "ada", "password": "pw-ada-123"},
                                format="json")
    assert response.status_code == 200 and response.json()["token"]


def test_a_body_over_the_upload_limit_is_a_json_413_with_the_limit(api, small_spec):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    small_spec["name"] = "x" * limit
    response = api.post("/api/jobs/", json.dumps(small_spec), content_type="application/json")
    assert response.status_code == 413
    assert response.json() == {"detail": f"request body over {limit} bytes"}
    assert not Job.objects.exists()

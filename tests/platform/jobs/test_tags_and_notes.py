"""A job's owner labels it with tags and a note (PATCH /api/jobs/<id>/); the job list filters
by tag."""

import pytest

from jobs.models import AuditEntry, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(user, small_spec) -> Job:
    return Job.objects.create(name="labelled", owner=user, spec=small_spec)


def test_the_owner_sets_tags_and_a_note_and_the_change_is_audited(api, job):
    response = api.patch(f"/api/jobs/{job.pk}/", {"tags": ["paro", "ablation", "paro"],
                                                   "note": "  NNG vs GGG at 2x2  "},
                         format="json")
    assert response.status_code == 200, response.content
    assert response.json()["tags"] == ["paro", "ablation"]
    assert response.json()["note"] == "NNG vs GGG at 2x2"
    job.refresh_from_db()
    assert (job.tags, job.note) == (["paro", "ablation"], "NNG vs GGG at 2x2")
    entry = AuditEntry.objects.get(action="job.annotate")
    assert (entry.job, entry.actor, entry.details["tags"]) == (job, "ada", ["paro", "ablation"])

    # a note alone leaves the tags as they are
    api.patch(f"/api/jobs/{job.pk}/", {"note": ""}, format="json")
    job.refresh_from_db()
    assert (job.tags, job.note) == (["paro", "ablation"], "")


@pytest.mark.parametrize("body, field", [
    ({"tags": "paro"}, "tags"),
    ({"tags": ["Has Space"]}, "tags"),
    ({"tags": ['"quoted"']}, "tags"),
    ({"tags": [f"t{i}" for i in range(17)]}, "tags"),
    ({"note": "x" * 2001}, "note"),
    ({"name": "renamed"}, "non_field_errors"),
    ({"state": "completed", "tags": ["ok"]}, "non_field_errors"),
])
def test_anything_but_valid_tags_and_a_note_is_refused_naming_the_field(api, job, body, field):
    response = api.patch(f"/api/jobs/{job.pk}/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    job.refresh_from_db()
    assert (job.name, job.state, job.tags) == ("labelled", "queued", [])
    assert not AuditEntry.objects.filter(action="job.annotate").exists()


def test_another_users_job_is_404_and_untouched(api, other_user, small_spec):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    assert api.patch(f"/api/jobs/{theirs.pk}/", {"note": "mine now"},
                     format="json").status_code == 404
    theirs.refresh_from_db()
    assert theirs.note == ""


def test_put_is_not_offered(api, job):
    assert api.put(f"/api/jobs/{job.pk}/", {"note": "x"}, format="json").status_code == 405


def test_the_list_filters_by_one_whole_tag(api, user, small_spec):
    def tagged(name: str, tags: list[str]) -> Job:
        return Job.objects.create(name=name, owner=user, spec=small_spec, tags=tags)

    paro, both = tagged("a", ["paro"]), tagged("b", ["ablation", "paro"])
    tagged("c", ["paro-old"])
    tagged("d", [])
    listed = api.get("/api/jobs/", {"tag": "paro"}).json()["results"]
    assert {j["id"] for j in listed} == {paro.pk, both.pk}
    assert api.get("/api/jobs/", {"tag": "PARO"}).json()["count"] == 2
    assert api.get("/api/jobs/", {"tag": "par"}).json()["count"] == 0

"""`Checkpoint` moves from monitor to jobs in the models' state alone: neither migration
touches the database, so the stored checkpoints (and the exports and evaluations pointing at
them) stay where they are, under the table they always had."""

from io import StringIO

import pytest
from django.core.management import call_command

from jobs.models import Checkpoint, Evaluation, Export


def sql_of(app: str, migration: str, backwards: bool = False) -> list[str]:
    """The statements `sqlmigrate` prints for a migration (comments and transaction aside)."""
    out = StringIO()
    call_command("sqlmigrate", app, migration, backwards=backwards, stdout=out)
    return [line for line in out.getvalue().splitlines()
            if line.strip() and not line.startswith("--") and line not in ("BEGIN;", "COMMIT;")]


@pytest.mark.django_db(transaction=True)  # sqlmigrate opens a schema editor
def test_neither_migration_runs_a_statement_either_way():
    for app, migration in (("jobs", "0018_checkpoint_from_monitor"),
                           ("monitor", "0009_checkpoint_to_jobs")):
        assert sql_of(app, migration) == [], (app, migration)
        assert sql_of(app, migration, backwards=True) == [], (app, migration)


def test_the_model_keeps_its_table_and_the_artifacts_point_at_it():
    assert Checkpoint._meta.db_table == "monitor_checkpoint"
    for model in (Export, Evaluation):
        assert model._meta.get_field("checkpoint").related_model is Checkpoint

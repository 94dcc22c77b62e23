"""The goodput ledger kept with each job (monitor.goodput); a job without one gets it from its
stored events when it is first read or folded into."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0010_placement"),
        ("monitor", "0006_job_keys_without_constraint"),
    ]

    operations = [
        migrations.CreateModel(
            name="Goodput",
            fields=[
                ("job", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                             primary_key=True, related_name="goodput",
                                             serialize=False, to="jobs.job")),
                ("ledger", models.JSONField(help_text="monitor.goodput.Ledger.to_dict()")),
                ("last_seq", models.PositiveBigIntegerField(
                    default=0, help_text="the newest event folded in")),
            ],
        ),
    ]

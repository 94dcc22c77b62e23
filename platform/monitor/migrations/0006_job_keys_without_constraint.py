"""The monitor tables' job keys lose their database constraint (monitor.models._job_key)."""

import django.db.models.deletion
from django.db import migrations, models

RELATED_NAMES = {
    "action": "actions",
    "anomaly": "anomalies",
    "checkpoint": "stored_checkpoints",
    "event": "bus_events",
    "expertload": "expert_loads",
    "metricpoint": "metric_points",
    "opssample": "ops_samples",
}


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_job_undispatched_since"),
        ("monitor", "0005_event_document_as_text"),
    ]

    operations = [
        migrations.AlterField(
            model_name=model_name,
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name=related_name,
                to="jobs.job",
            ),
        )
        for model_name, related_name in RELATED_NAMES.items()
    ]

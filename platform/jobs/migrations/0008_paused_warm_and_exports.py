# The job state paused_warm (engine.contract.JobState: a choices change only, no SQL), and the
# exports of checkpoints as Hugging Face model folders (jobs.exports).

import django.db.models.deletion
from django.db import migrations, models

STATES = [("queued", "Queued"), ("starting", "Starting"), ("running", "Running"),
          ("pausing", "Pausing"), ("paused", "Paused"), ("paused_warm", "Paused Warm"),
          ("rolling_back", "Rolling Back"), ("resharding", "Resharding"),
          ("completing", "Completing"), ("completed", "Completed"), ("failed", "Failed"),
          ("cancelled", "Cancelled")]


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_job_tags_note"),
        ("monitor", "0006_job_keys_without_constraint"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(choices=STATES, default="queued", max_length=16),
        ),
        migrations.AlterField(
            model_name="jobevent",
            name="from_state",
            field=models.CharField(choices=STATES, max_length=16),
        ),
        migrations.AlterField(
            model_name="jobevent",
            name="to_state",
            field=models.CharField(choices=STATES, max_length=16),
        ),
        migrations.CreateModel(
            name="Export",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("state", models.CharField(
                    choices=[("pending", "Pending"), ("running", "Running"), ("done", "Done"),
                             ("failed", "Failed")],
                    default="pending", max_length=8)),
                ("out_dir", models.CharField(help_text="the model folder", max_length=1024)),
                ("error", models.TextField(blank=True)),
                ("summary", models.JSONField(
                    blank=True, default=dict,
                    help_text="engine.export's summary: files, tensors, bytes")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("checkpoint", models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, related_name="export",
                    to="monitor.checkpoint")),
            ],
        ),
    ]

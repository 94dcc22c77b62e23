# Per-user limits set by staff (jobs.models.Quota); empty fields take the settings' defaults.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0013_api_token_digest"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Quota",
            fields=[
                ("user", models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                    related_name="quota", serialize=False, to=settings.AUTH_USER_MODEL)),
                ("jobs", models.PositiveIntegerField(
                    blank=True, null=True,
                    help_text="jobs queued or running at once (a paused or finished job does "
                              "not count); empty: RINGSIDE_QUOTA_JOBS; 0: no limit")),
                ("slots", models.PositiveIntegerField(
                    blank=True, null=True,
                    help_text="slots its jobs hold at once (a job that would go over waits); "
                              "empty: RINGSIDE_QUOTA_SLOTS; 0: no limit")),
                ("checkpoint_bytes", models.PositiveBigIntegerField(
                    blank=True, null=True,
                    help_text="bytes of its jobs' checkpoints still stored (a job that writes "
                              "one over it is paused); empty: RINGSIDE_QUOTA_CHECKPOINT_BYTES; "
                              "0: no limit")),
            ],
        ),
    ]

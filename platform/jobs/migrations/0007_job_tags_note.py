# A job's tags and note: labels and free text its owner sets from the list page or the API.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_command_kind_set"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="tags",
            field=models.JSONField(
                blank=True, default=list,
                help_text="the owner's labels (jobs.serializers.JobNoteSerializer)"),
        ),
        migrations.AddField(
            model_name="job",
            name="note",
            field=models.TextField(blank=True, help_text="the owner's free-text note"),
        ),
    ]

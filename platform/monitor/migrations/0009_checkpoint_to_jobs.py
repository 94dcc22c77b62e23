"""`Checkpoint` now belongs to the jobs app (jobs 0018): gone from monitor's models' state,
its table and rows kept as they are."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0018_checkpoint_from_monitor"),
        ("monitor", "0008_checkpoint_lineage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.DeleteModel(name="Checkpoint"),
        ]),
    ]

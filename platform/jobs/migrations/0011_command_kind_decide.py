# The contract's new command kind, `decide` (an answer to a proposal of the fault policy): a
# choices change only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0010_placement"),
    ]

    operations = [
        migrations.AlterField(
            model_name="command",
            name="kind",
            field=models.CharField(
                choices=[("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel"),
                         ("checkpoint", "Checkpoint"), ("rollback", "Rollback"),
                         ("reshard", "Reshard"), ("set", "Set"), ("decide", "Decide")],
                max_length=16),
        ),
    ]

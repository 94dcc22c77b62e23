# The contract's new command kind, `set` (live settings): a choices change only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0005_command_kind_choices_from_the_contract"),
    ]

    operations = [
        migrations.AlterField(
            model_name="command",
            name="kind",
            field=models.CharField(
                choices=[("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel"),
                         ("checkpoint", "Checkpoint"), ("rollback", "Rollback"),
                         ("reshard", "Reshard"), ("set", "Set")],
                max_length=16),
        ),
    ]

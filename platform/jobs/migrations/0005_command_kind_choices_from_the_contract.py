# The command kinds are the engine's (engine.contract.CommandKind), in its order: a choices
# change only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0004_command_engine_args"),
    ]

    operations = [
        migrations.AlterField(
            model_name="command",
            name="kind",
            field=models.CharField(
                choices=[("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel"),
                         ("checkpoint", "Checkpoint"), ("rollback", "Rollback"),
                         ("reshard", "Reshard")],
                max_length=16),
        ),
    ]

# The contract's new command kind, `rebalance` (the ranks' shares of the batch): a choices
# change only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_command_kind_decide"),
    ]

    operations = [
        migrations.AlterField(
            model_name="command",
            name="kind",
            field=models.CharField(
                choices=[("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel"),
                         ("checkpoint", "Checkpoint"), ("rollback", "Rollback"),
                         ("reshard", "Reshard"), ("set", "Set"), ("decide", "Decide"),
                         ("rebalance", "Rebalance")],
                max_length=16),
        ),
    ]

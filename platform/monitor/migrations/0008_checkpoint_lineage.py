"""Each checkpoint's lineage as its event carried it (engine.runtime.lineage); null for the
checkpoints stored before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("monitor", "0007_goodput")]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="lineage",
            field=models.JSONField(help_text="what made it (engine.runtime.lineage); null for "
                                             "one saved before lineages", null=True),
        ),
    ]

"""The `Checkpoint` model moves from monitor to jobs (jobs finds, exports and evaluates
checkpoints; monitor only stores their events): in the models' state only. Its table stays
`monitor_checkpoint` with its rows, and the foreign keys of exports and evaluations keep
pointing at it."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0017_evaluation_automatic"),
        ("monitor", "0008_checkpoint_lineage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name="Checkpoint",
                fields=[
                    ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                               serialize=False, verbose_name="ID")),
                    ("seq", models.PositiveBigIntegerField()),
                    ("step", models.PositiveIntegerField()),
                    ("time", models.FloatField()),
                    ("path", models.CharField(max_length=1024)),
                    ("tier", models.CharField(blank=True, help_text='"disk" or "memory"',
                                              max_length=16)),
                    ("size_bytes", models.PositiveBigIntegerField(null=True)),
                    ("strategy", models.CharField(blank=True, max_length=8)),
                    ("world_size", models.PositiveIntegerField(null=True)),
                    ("blocking_s", models.FloatField(help_text="how long training waited for it",
                                                     null=True)),
                    ("lineage", models.JSONField(
                        help_text="what made it (engine.runtime.lineage); null for one saved "
                                  "before lineages", null=True)),
                    ("job", models.ForeignKey(db_constraint=False, db_index=False,
                                              on_delete=django.db.models.deletion.CASCADE,
                                              related_name="stored_checkpoints",
                                              to="jobs.job")),
                ],
                options={"db_table": "monitor_checkpoint", "ordering": ["job", "seq"]},
            ),
            migrations.AddConstraint(
                model_name="checkpoint",
                constraint=models.UniqueConstraint(fields=("job", "seq"),
                                                   name="checkpoint_once"),
            ),
            migrations.AlterField(
                model_name="evaluation",
                name="checkpoint",
                field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                        related_name="evaluations", to="jobs.checkpoint"),
            ),
            migrations.AlterField(
                model_name="export",
                name="checkpoint",
                field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="export", to="jobs.checkpoint"),
            ),
        ]),
    ]

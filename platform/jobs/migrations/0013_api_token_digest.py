"""API tokens keep only the SHA-256 of their key: the column is renamed and each stored key
replaced by its digest, so the keys users already hold keep working. One way only: a digest
cannot be turned back into its key."""

from django.db import migrations, models

from jobs.models import token_digest


def hash_keys(apps, schema_editor) -> None:
    ApiToken = apps.get_model("jobs", "ApiToken")
    for token in ApiToken.objects.all().only("pk", "digest"):
        # a clear key is 40 hex characters, a digest 64: no collision on the unique column
        # while the two kinds are both present
        ApiToken.objects.filter(pk=token.pk).update(
            digest=token_digest(token.digest))


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0012_command_kind_rebalance"),
    ]

    operations = [
        migrations.RenameField(model_name="apitoken", old_name="key", new_name="digest"),
        migrations.AlterField(model_name="apitoken", name="digest",
                              field=models.CharField(max_length=64, unique=True)),
        migrations.RunPython(hash_keys),
    ]

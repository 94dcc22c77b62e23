from django.db import migrations

from monitor.migrations._lz4 import compress_events_with_lz4


def store_event_documents_as(column_type: str):
    """monitor.models.EventDocument as `column_type` on PostgreSQL. Changing a column's type
    also drops its compression setting, so it is set again."""

    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        schema_editor.execute(f"ALTER TABLE monitor_event ALTER COLUMN data TYPE {column_type} "
                              f"USING data::{column_type}")
        compress_events_with_lz4(apps, schema_editor)

    return run


class Migration(migrations.Migration):
    dependencies = [("monitor", "0004_event_json_no_job_index")]

    operations = [
        migrations.RunPython(store_event_documents_as("text"), store_event_documents_as("json")),
    ]

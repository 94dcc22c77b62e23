"""lz4 compression of the stored event documents, for migrations 0004 and 0005 (a module whose
name starts with an underscore is not a migration)."""

from django.db import DatabaseError, transaction


def compress_events_with_lz4(apps, schema_editor) -> None:
    """lz4 for the event documents where the server has it (PostgreSQL 14+ built with lz4):
    with its default, pglz, the engine's event mix went in 2.5x slower. Elsewhere the default
    stays."""
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.pg_version < 140000:
        return
    try:
        with transaction.atomic(using=connection.alias):  # a savepoint: a refusal is no harm
            schema_editor.execute("ALTER TABLE monitor_event ALTER COLUMN data SET COMPRESSION lz4")
    except DatabaseError:  # a server built without lz4 keeps pglz
        pass

"""The test services (tests/platform/services.py) against the database they share with this
process."""

import threading

import psycopg
import pytest
from django.db import connection

from tests.platform.services import _database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite locks the whole file")
def test_a_flush_outlives_a_deadlock_with_a_services_query(eventually):
    """This process truncates two tables (as a flush does, one lock after the other) while a
    service's session reads them in the other order: the service's query is the one aborted."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE flush_a (x int); CREATE TABLE flush_b (x int)")
    url = _database_url(connection.settings_dict)  # a service's: PostgreSQL's own settings
    outcome: dict[str, str] = {}

    def flush() -> None:  # a thread of this process: a connection of its own, same settings
        from django.db import connection as own

        try:
            with own.cursor() as cursor:
                cursor.execute("TRUNCATE flush_a, flush_b")
            outcome["flush"] = "done"
        finally:
            own.close()

    def flush_waits() -> bool:
        """Whether the flush holds flush_a and waits for flush_b."""
        with psycopg.connect(url, autocommit=True) as peek:
            waiting = peek.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE 'TRUNCATE flush_a%'")
            return waiting.fetchone()[0] == 1

    try:
        with psycopg.connect(url) as service:
            service.execute("SELECT * FROM flush_b")  # its transaction holds flush_b
            flushing = threading.Thread(target=flush)
            flushing.start()
            eventually(flush_waits, 30, "the flush did not come to wait for flush_b")
            with pytest.raises(psycopg.errors.DeadlockDetected):
                service.execute("SELECT * FROM flush_a")
            service.rollback()
            flushing.join(timeout=30)
        assert outcome == {"flush": "done"}
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE flush_a, flush_b")

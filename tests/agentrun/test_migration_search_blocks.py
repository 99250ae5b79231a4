"""Migration 0018 stores the search index's text lz4-compressed where PostgreSQL has lz4."""

import pytest
from django.db import DatabaseError, connection, transaction

from agentrun.models import SearchBlock

pytestmark = pytest.mark.django_db


def server_has_lz4() -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL default_toast_compression = lz4")
    except DatabaseError:
        return False
    return True


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL column setting")
def test_the_index_text_is_lz4_where_the_server_has_it():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attname = 'body'",
            [SearchBlock._meta.db_table],
        )
        (method,) = cursor.fetchone()
    assert method == ("l" if server_has_lz4() else "")

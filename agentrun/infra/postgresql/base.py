"""Django's PostgreSQL backend, checking each connection it takes from the pool.

After a PostgreSQL restart (or a network cut, or a server's idle timeout) every idle
connection in the pool is dead, and the pool hands them out as if they worked: a request
answered 500 with "terminating connection due to administrator command". Each connection
is checked as it is taken (an empty query, one round trip): a dead one goes back to the
pool, which drops it, and the next is tried at once.

Not the pool's own `check` (Django's CONN_HEALTH_CHECKS with a pool): it waits longer
after each dead connection it finds (a second, then two, four...), so with a pool of nine
dead ones a request waits past DB_POOL_TIMEOUT and fails after all.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        pool = self.pool
        if pool is None:
            return super().get_new_connection(conn_params)
        for _ in range(pool.max_size):
            conn = super().get_new_connection(conn_params)
            try:
                pool.check_connection(conn)
            except psycopg.Error:
                pool.putconn(conn)  # broken: the pool closes it and opens another
                continue
            return conn
        # Every connection the pool held was dead: one it opens now.
        return super().get_new_connection(conn_params)

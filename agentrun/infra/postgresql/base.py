"""Django's PostgreSQL backend, whose pooled connection a thread can lend between writes.

A step hands its connection back before it calls a model or a tool, and takes one again
for its next write. Through the pool that is a putconn and a getconn, and Django's
connect() in between (its settings checks, its parameters, its signal): about 6% of a
CPU-bound step's CPU, for a step whose model and tools answer within a millisecond.

So the step lends it instead (`lend`): the connection stays with the thread's wrapper,
and the process's lender knows that it is idle.
- The thread's next use of its wrapper takes it back, untouched, if it is still there
  (every read of `connection` does, so no code can reach it without taking it back).
- Another thread that needs a connection takes the one lent the longest ago, before it
  asks the pool (a connection lent is as idle as one in the pool).
- One lent for `LEND_SECONDS` goes back to the pool (the lender's thread), so a step
  that waits on a model holds no connection for longer than that.
- While a thread waits in the pool for a connection (all of them out), nothing is lent:
  the connection goes to the pool, which hands it to that thread at once.

Connections per process stay within the pool's size: a lent connection is one the pool
has handed out. Without a pool (DB_POOL_MAX_SIZE=0) a thread keeps its connection, as
before; `lend` then does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import IsolationLevel
from psycopg.pq import TransactionStatus

_IDLE = TransactionStatus.IDLE

#: How long a lent connection stays with its thread before it goes back to the pool.
LEND_SECONDS = 0.01


class _Lender:
    """The connections lent by this process's threads, oldest first, and the thread that
    returns them to the pool once they were lent for LEND_SECONDS. It looks every
    LEND_SECONDS while connections are being lent (a wake-up at every lend would cost
    more than the lend saves), and sleeps once none was lent for a second."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lent: dict[DatabaseWrapper, float] = {}  # wrapper -> when it goes back
        self._wake = threading.Event()
        self._asleep = True
        self._last = 0.0
        self._thread: threading.Thread | None = None

    def lend(self, wrapper: DatabaseWrapper) -> None:
        now = time.monotonic()
        with self.lock:
            self.lent[wrapper] = now + LEND_SECONDS
            wrapper._lent = True
            self._last = now
            if self._asleep:
                self._asleep = False
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="agentrun-db-lender", daemon=True
                    )
                    self._thread.start()
                self._wake.set()

    def take_back(self, wrapper: DatabaseWrapper) -> None:
        """The thread's own connection back from the lender, if still there (one that went
        back to the pool or to another thread left None in its place: _detach)."""
        with self.lock:
            wrapper._lent = False
            self.lent.pop(wrapper, None)

    def take_any(self, pool: Any) -> Any:
        """The connection from `pool` lent the longest ago (its thread will connect
        again), or None. (Another alias, or a pool replaced since, has connections of
        its own.)"""
        with self.lock:
            for wrapper in self.lent:
                if getattr(wrapper._conn, "_pool", None) is pool:
                    return self._detach(wrapper)
            return None

    def _detach(self, wrapper: DatabaseWrapper) -> Any:
        del self.lent[wrapper]
        conn, wrapper._conn, wrapper._lent = wrapper._conn, None, False
        return conn

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(LEND_SECONDS)
            with self.lock:
                now = time.monotonic()
                due = []
                for wrapper, at in self.lent.items():
                    if at > now:
                        break
                    due.append(wrapper)
                conns = [self._detach(wrapper) for wrapper in due]
                if not self.lent and now - self._last > 1.0:
                    self._asleep = True
                    self._wake.clear()
            for conn in conns:
                _give_back(conn)

    def forget(self) -> None:
        """In a forked child: the lent connections are the parent's; never use them."""
        for wrapper in self.lent:
            wrapper._conn, wrapper._lent = None, False
        self.__init__()  # type: ignore[misc]  # (a new lock: the parent's may be held)


def _give_back(conn: Any) -> None:
    pool = getattr(conn, "_pool", None)
    try:
        if pool is not None:
            pool.putconn(conn)
        else:
            conn.close()
    except Exception:  # noqa: BLE001 - a broken connection is dropped, as the pool would
        conn.close()


LENDER = _Lender()
os.register_at_fork(after_in_child=LENDER.forget)


class DatabaseWrapper(base.DatabaseWrapper):
    _conn: Any = None
    _lent = False

    @property  # type: ignore[override]
    def connection(self) -> Any:
        if self._lent:
            LENDER.take_back(self)
        return self._conn

    @connection.setter
    def connection(self, value: Any) -> None:
        if self._lent:
            LENDER.take_back(self)
        self._conn = value

    def lend(self) -> bool:
        """Lend this thread's pooled connection until its next use (see the module's
        text); False: nothing to lend (no pool, no connection, or in a transaction)."""
        pool = self.pool
        if self._lent or self._conn is None or self.in_atomic_block or pool is None:
            return False
        conn = self._conn
        if getattr(pool, "_waiting", None) or conn.info.transaction_status != _IDLE:
            # A thread waits in the pool for a connection: it gets this one now. (One that
            # is broken, or in a transaction opened by hand, goes to the pool too, which
            # drops it or rolls back, rather than to another thread.)
            self.close()
        else:
            LENDER.lend(self)
        return True

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        pool = self.pool
        conn = LENDER.take_any(pool) if pool is not None else None
        if conn is None:
            return super().get_new_connection(conn_params)
        # What super() sets besides: the wrapper's isolation level (the connection, from
        # the same pool, was set up by it when it was first taken).
        level = self.settings_dict["OPTIONS"].get("isolation_level")
        default = IsolationLevel.READ_COMMITTED
        self.isolation_level = default if level is None else IsolationLevel(level)
        return conn

"""A thread lends its pooled connection between writes (agentrun/infra/postgresql/base.py).

It takes it back untouched if nobody needed it; another thread takes it before it asks
the pool; after LEND_SECONDS it goes back to the pool. A connection is never in two
places at once.
"""

import random
import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections

from agentrun.engine import release_connection
from agentrun.infra.postgresql import base

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no pool"),
    pytest.mark.durability,
]


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _closing(fn):
    """fn, then this thread's connections back (as a worker thread's end does)."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    return run


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(_closing(fn)()))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    return out[0]


def _lent() -> set:
    with base.LENDER.lock:
        return set(base.LENDER.lent)


def test_a_thread_takes_its_lent_connection_back_untouched():
    pid = _backend_pid()
    raw = connection.connection
    release_connection()
    assert connection._lent and connection._conn is raw
    assert _lent() == {connections["default"]}
    assert _backend_pid() == pid
    assert connection.connection is raw  # the same session, no checkout
    assert not connection._lent and _lent() == set()


def test_a_lent_connection_goes_back_to_the_pool_after_a_while():
    _backend_pid()
    pool = connection.pool
    available = pool.get_stats().get("pool_available", 0)
    release_connection()
    deadline = time.monotonic() + 5
    while connection._conn is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert connection._conn is None and not connection._lent
    assert pool.get_stats().get("pool_available", 0) == available + 1
    assert _backend_pid() > 0  # the thread connects again from the pool


def test_another_thread_takes_a_lent_connection_before_asking_the_pool():
    pid = _backend_pid()
    release_connection()
    requests = connection.pool.get_stats().get("requests_num", 0)
    assert _in_thread(_backend_pid) == pid
    assert connection.pool.get_stats().get("requests_num", 0) == requests
    # The lender's own thread: its connection went to the other thread, so it takes one again.
    assert connection._conn is None
    assert _backend_pid() > 0


def test_a_lent_connection_closed_by_its_thread_goes_back_once():
    _backend_pid()
    pool = connection.pool
    release_connection()
    connection.close()
    assert _lent() == set() and connection._conn is None
    time.sleep(base.LEND_SECONDS * 5)  # the lender has nothing left to give back
    stats = pool.get_stats()
    assert stats.get("pool_available", 0) <= stats["pool_size"]


def test_nothing_is_lent_inside_a_transaction():
    from django.db import transaction

    with transaction.atomic():
        _backend_pid()
        release_connection()
        assert not connection._lent and _lent() == set()


@pytest.mark.skipif(
    settings.AGENTRUN_PGBOUNCER,
    reason="behind PgBouncer a backend pid names the server connection of one transaction",
)
def test_threads_lending_and_taking_share_the_pool_and_never_one_connection():
    # Each thread asks the database for its session and writes what it saw, lending its
    # connection in between; no two threads may be in one session at once, and no more
    # sessions are used than the pool holds.
    seen: dict[int, int] = {}  # backend pid -> thread using it now
    lock = threading.Lock()
    errors: list[str] = []
    pids: set[int] = set()

    def worker(n: int) -> None:
        rnd = random.Random(n)
        try:
            for _ in range(40):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    pid = cursor.fetchone()[0]
                    with lock:
                        if seen.get(pid, n) != n:
                            errors.append(f"session {pid} used by threads {seen[pid]} and {n}")
                        seen[pid] = n
                        pids.add(pid)
                    cursor.execute("SELECT pg_sleep(0.001)")
                    with lock:
                        seen.pop(pid, None)
                release_connection()
                time.sleep(rnd.choice([0, 0.0005, 0.003, 0.02]))
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert 1 <= len(pids) <= connection.pool.max_size, pids


def test_a_connection_goes_to_the_pool_at_once_while_a_thread_waits_there():
    pool = connection.pool
    _backend_pid()
    hold = threading.Event()
    holding: list[int] = []

    @_closing
    def holder() -> None:
        holding.append(_backend_pid())
        hold.wait(30)

    holders = [threading.Thread(target=holder) for _ in range(pool.max_size - 1)]
    for t in holders:
        t.start()
    waiter = threading.Thread(target=lambda: holding.append(-_closing(_backend_pid)()))
    try:
        deadline = time.monotonic() + 20
        while len(holding) < pool.max_size - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(holding) == pool.max_size - 1  # this thread's and theirs: every one out
        waiter.start()
        while not pool.get_stats().get("requests_waiting") and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.get_stats().get("requests_waiting") == 1
        release_connection()
        assert connection._conn is None and not connection._lent  # handed over, not lent
        waiter.join(timeout=5)
        assert not waiter.is_alive() and len(holding) == pool.max_size
    finally:
        hold.set()
        for t in holders:
            t.join(timeout=30)
        waiter.join(timeout=30)


def test_only_a_connection_of_the_same_pool_is_taken():
    _backend_pid()
    raw = connection.connection
    release_connection()
    assert base.LENDER.take_any(object()) is None  # another pool's thread: not this one
    assert connection._lent and _lent() == {connections["default"]}
    assert base.LENDER.take_any(connection.pool) is raw
    assert connection._conn is None and not connection._lent
    raw._pool.putconn(raw)


def test_a_connection_in_a_transaction_opened_by_hand_goes_to_the_pool_not_to_a_thread():
    connection.set_autocommit(False)
    try:
        _backend_pid()  # a transaction is open now
        release_connection()
        assert not connection._lent and connection._conn is None and _lent() == set()
    finally:
        connection.set_autocommit(True)

"""A PostgreSQL restart costs no request a 500.

A real gunicorn serves the API and the pages while the test restarts the database server
(down for a few seconds) and polls both every 100 ms: each answer is a 200 or, while the
database is down, a 503 with Retry-After and a plain message; the connections the restart
closed are never handed to a request once it is back (the pool checks each one).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from agentrun.infra.outage import MESSAGE
from agentrun.models import ApiToken
from tests.agentrun.llm_load import on_postgres
from tests.agentrun.test_scale_postgres_restart import (
    _cannot_restart,
    cluster_of_test_database,
    reconnect,
    server_start_time,
)
from tests.base import make_people, make_run
from tests.workers import ROOT, wait_until, worker_env

_why = _cannot_restart()
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif(not on_postgres(), reason="the pool and its restarts are PostgreSQL's"),
]

DOWN_SECONDS = 3.0


@dataclass
class Answer:
    at: float
    what: str
    status: int
    retry_after: str | None
    body: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, headers: dict[str, str]) -> tuple[int, str | None, str]:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http://127.0.0.1
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return response.status, response.headers.get("Retry-After"), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After"), exc.read().decode()


class Poller:
    """A request every 100 ms (the API and the run list by turns), each in its own thread
    so that one waiting on the database does not hold back the next."""

    def __init__(self, base: str, token: str, session: str):
        self.targets = [
            ("api", f"{base}/api/runs", {"Authorization": f"Bearer {token}"}),
            ("page", f"{base}/", {"Cookie": f"sessionid={session}"}),
        ]
        self.answers: list[Answer] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _one(self, what: str, url: str, headers: dict[str, str]) -> None:
        at = time.monotonic()
        try:
            status, retry_after, body = get(url, headers)
        except Exception as exc:  # noqa: BLE001 - a reset or a timeout is a failure too
            with self._lock:
                self.failures.append(f"{what}: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.answers.append(Answer(at, what, status, retry_after, body))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            what, url, headers = self.targets[i % 2]
            thread = threading.Thread(target=self._one, args=(what, url, headers), daemon=True)
            thread.start()
            self._threads.append(thread)
            i += 1
            self._stop.wait(0.1)

    def __enter__(self) -> Poller:
        self._main = threading.Thread(target=self._run, daemon=True)
        self._main.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._main.join()
        for thread in self._threads:
            thread.join(timeout=90)


def start_gunicorn(port: int, tmp_path: Path) -> subprocess.Popen:
    env = worker_env(
        DEBUG="0",
        ALLOWED_HOSTS="127.0.0.1",
        # A request waits this long for a connection while the database is down.
        DB_POOL_TIMEOUT="2",
    )
    log = open(tmp_path / "gunicorn.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "agentrun.wsgi", "-b", f"127.0.0.1:{port}"]
        + ["-w", "1", "--threads", "16", "--timeout", "120"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@dataclass
class Site:
    base: str
    token: str
    session: str
    log_path: Path

    def api(self) -> tuple[int, str | None, str]:
        return get(f"{self.base}/api/runs", {"Authorization": f"Bearer {self.token}"})

    def page(self) -> tuple[int, str | None, str]:
        return get(f"{self.base}/", {"Cookie": f"sessionid={self.session}"})


@pytest.fixture
def site(tmp_path):
    """gunicorn serving a few runs, a token for the API and a session for the pages."""
    people = make_people()
    for _ in range(3):
        make_run()
    token = ApiToken.issue(people["operator"])
    client = Client()
    client.force_login(people["viewer"])
    port = free_port()
    site = Site(
        f"http://127.0.0.1:{port}",
        token,
        client.cookies["sessionid"].value,
        tmp_path / "gunicorn.log",
    )
    server = start_gunicorn(port, tmp_path)

    def serving() -> bool:
        try:
            return site.api()[0] == 200
        except OSError:
            return False

    try:
        wait_until(serving, timeout=30, interval=0.2, what="gunicorn to serve the API")
        yield site
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_connections_the_server_closed_are_replaced_before_a_request_gets_one(site):
    # Several connections in gunicorn's pool, idle: then the server ends them all, as a
    # restart between two requests or an idle timeout would.
    for _ in range(3):
        threads = [threading.Thread(target=site.api) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    with connection.cursor() as cursor:
        # With a timeout, pg_terminate_backend returns once each process has ended: the
        # server has closed the connections before the next request.
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 2  # gunicorn's pool held more than one

    answers = [site.api()[0] if i % 2 else site.page()[0] for i in range(20)]

    assert answers == [200] * 20


@pytest.mark.skipif(bool(_why), reason=_why)
def test_a_postgresql_restart_answers_200_or_503_never_500(site):
    base, token, session = site.base, site.token, site.session
    version, cluster = cluster_of_test_database()
    try:
        started = server_start_time()
        ctl = ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster]
        with Poller(base, token, session) as poller:
            time.sleep(1.5)
            down_at = time.monotonic()
            try:
                subprocess.run([*ctl, "stop"], check=True, timeout=120)
                time.sleep(DOWN_SECONDS)
            finally:
                subprocess.run([*ctl, "start"], check=True, timeout=120)
            up_at = time.monotonic()
            reconnect()
            # Polling goes on until both the API and the page answer 200 again.
            wait_until(
                lambda: (
                    {a.what for a in poller.answers if a.at > up_at and a.status == 200}
                    == {"api", "page"}
                ),
                timeout=60,
                interval=0.2,
                what="the API and the pages to answer 200 again",
            )
            time.sleep(1.0)
        assert server_start_time() > started, "the server did not restart"
    finally:
        reconnect()
    log = site.log_path.read_text()

    answers = poller.answers
    statuses = sorted({a.status for a in answers})
    summary = {s: sum(1 for a in answers if a.status == s) for s in statuses}
    print(f"answers by status: {summary}; {len(poller.failures)} failed requests")
    assert not poller.failures, poller.failures[:5]
    assert statuses == [200, 503], (summary, log[-3000:])
    assert len(answers) > 40  # about ten a second for several seconds
    for answer in answers:
        if answer.status == 503:
            # No answer came before the stop: the restart is what the 503s are about.
            assert answer.at >= down_at
            assert answer.retry_after == "5"
            assert MESSAGE in answer.body
            assert "Traceback" not in answer.body
    outage = [a for a in answers if a.status == 503]
    assert {a.what for a in outage} == {"api", "page"}, summary
    assert "Internal Server Error" not in log

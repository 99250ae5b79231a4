"""The `llm` agent's HTTP client: one keep-alive connection per thread, a connection the
provider closed is replaced, and a proxy or a redirect goes through httpx (the SDK's client)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentrun.agents import AgentError, StepContext, get_agent
from agentrun.builtin import llm
from tests.fake_openai import FakeOpenAI, Reply, completion

API_KEY = "arllm-" + "k3y-2b7e0c4f9a1d63e8"
GOAL = "Answer at once."


@pytest.fixture(autouse=True)
def _fresh_connections():
    """Each test starts without this thread's cached connection or client, and leaves none."""

    def drop() -> None:
        cached = getattr(llm._LOCAL, "conn", None)
        if cached is not None:
            cached[1].close()
        client = getattr(llm._LOCAL, "http", None)
        if client is not None:
            client[1].close()
        llm._LOCAL.conn = llm._LOCAL.http = None

    drop()
    yield
    drop()


@pytest.fixture
def provider(settings, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    with FakeOpenAI(keep_alive=True) as server:
        settings.AGENTRUN_LLM_BASE_URL = server.base_url
        settings.AGENTRUN_LLM_MODEL = "fake-model"
        settings.AGENTRUN_LLM_TIMEOUT = 5.0
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        yield server


def answer() -> Any:
    agent = get_agent("llm")
    inp = {"goal": GOAL}
    return agent.decide(agent.initial_state(inp), StepContext("run-1", 1, inp)).final


def test_a_threads_requests_share_one_connection(provider):
    provider.push(completion("one"), completion("two"), completion("three"))
    assert [answer(), answer(), answer()] == ["one", "two", "three"]
    requests = provider.chat_requests()
    assert len(requests) == 3
    assert len({r.peer for r in requests}) == 1
    assert requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_each_thread_has_its_own_connection(provider):
    provider.push(completion("main"), completion("other"))
    assert answer() == "main"
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(answer()))
    thread.start()
    thread.join()
    assert got == ["other"]
    assert len({r.peer for r in provider.chat_requests()}) == 2


def test_a_connection_the_provider_closed_while_idle_is_replaced(provider):
    provider.push(completion("one"), Reply(200, completion("two"), hang_up=True))
    provider.push(completion("three"))
    assert answer() == "one"
    assert answer() == "two"
    time.sleep(0.3)  # the server closes its end: the socket reads EOF from now on
    assert answer() == "three"  # not an APIConnectionError on the dead connection
    peers = [r.peer for r in provider.chat_requests()]
    assert peers[0] == peers[1] != peers[2]


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(provider):
    long = "word " * 2000
    provider.push(Reply(200, completion(long), chunked=700), completion("next"))
    assert answer() == long
    assert answer() == "next"
    assert len({r.peer for r in provider.chat_requests()}) == 1


def test_a_connection_idle_past_the_keepalive_expiry_is_not_reused(provider, monkeypatch):
    monkeypatch.setattr(llm, "KEEPALIVE_EXPIRY", 0.2)
    provider.push(completion("one"), completion("two"), completion("three"))
    assert answer() == "one"
    assert answer() == "two"  # at once: the same connection
    time.sleep(0.3)
    assert answer() == "three"
    peers = [r.peer for r in provider.chat_requests()]
    assert peers[0] == peers[1] != peers[2]


def test_an_exchange_cut_short_leaves_no_connection_to_reuse(provider, monkeypatch):
    """Anything raised mid-exchange (a time limit, say) leaves a request unanswered on
    the connection: the next request must not be sent on it."""

    class TimeLimit(BaseException):
        pass

    provider.push(completion("lost"), completion("next"))
    real = llm.http.client.HTTPResponse.read

    def cut(self, *args):
        raise TimeLimit()

    monkeypatch.setattr(llm.http.client.HTTPResponse, "read", cut)
    with pytest.raises(TimeLimit):
        answer()
    monkeypatch.setattr(llm.http.client.HTTPResponse, "read", real)
    assert answer() == "next"
    peers = [r.peer for r in provider.chat_requests()]
    assert len(peers) == 2 and peers[0] != peers[1]


def test_an_ipv6_provider_without_a_port(settings, monkeypatch):
    """http://[::1]/v1 means port 80: http.client alone would read "::1" as host ":"
    and port 1. (Nothing listens there: what matters is where the connection goes.)"""
    seen: list[tuple[str, Any]] = []

    def connect(self):
        seen.append((self.host, self.port))
        raise ConnectionRefusedError("not here")

    monkeypatch.setattr(llm.http.client.HTTPConnection, "connect", connect)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    settings.AGENTRUN_LLM_BASE_URL = "http://[::1]/v1"
    monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
    with pytest.raises(AgentError) as info:
        answer()
    assert info.value.transient is True
    assert seen == [("::1", 80)]


def test_an_error_status_keeps_the_sdk_error_and_the_connection(provider):
    provider.push(
        Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "7"}),
        completion("after"),
    )
    with pytest.raises(AgentError) as info:
        answer()
    exc = info.value
    assert exc.transient is True
    assert exc.retry_after == 7.0
    assert exc.detail["provider_error"] == "RateLimitError"
    assert exc.detail["status"] == 429
    assert exc.detail["request_id"] == "req_fake"
    assert "slow down" in str(exc)
    assert answer() == "after"
    assert len({r.peer for r in provider.chat_requests()}) == 1


def test_a_proxy_in_the_environment_is_used(provider, settings, monkeypatch):
    # The fake answers as the proxy would forward: the request line names the provider.
    settings.AGENTRUN_LLM_BASE_URL = "http://llm.invalid/v1"
    host, port = provider.base_url.split("//")[1].split("/")[0].split(":")
    monkeypatch.setenv("HTTP_PROXY", f"http://{host}:{port}")
    monkeypatch.setattr(llm._LOCAL, "http", None, raising=False)  # a client reads it at birth
    provider.push(completion("through the proxy"))
    assert answer() == "through the proxy"
    [request] = provider.chat_requests()
    assert request.target == "http://llm.invalid/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"


def test_a_redirect_is_followed(provider):
    moved = provider.base_url + "/chat/completions?moved=1"
    redirect = Reply(307, "", headers={"Location": moved})
    provider.push(redirect, redirect, completion("moved"))
    assert answer() == "moved"
    assert [r.target for r in provider.chat_requests()] == [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions?moved=1",
    ]


# --- https, as every hosted provider is --------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (the openssl command line)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost"],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_provider(settings, monkeypatch, certificate):
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(llm, "_TLS", None)  # built again, from this environment
    with FakeOpenAI(keep_alive=True, tls=context) as server:
        settings.AGENTRUN_LLM_BASE_URL = server.base_url
        settings.AGENTRUN_LLM_MODEL = "fake-model"
        settings.AGENTRUN_LLM_TIMEOUT = 5.0
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        yield server


def test_https_with_the_certificates_the_environment_trusts(tls_provider, monkeypatch, certificate):
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    tls_provider.push(completion("secure one"), completion("secure two"))
    assert tls_provider.base_url.startswith("https://localhost:")
    assert [answer(), answer()] == ["secure one", "secure two"]
    requests = tls_provider.chat_requests()
    assert len({r.peer for r in requests}) == 1  # one TLS connection, kept alive
    assert requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_https_to_a_certificate_nobody_trusts_is_refused(tls_provider):
    tls_provider.push(completion("never sent"))
    with pytest.raises(AgentError) as info:
        answer()
    assert info.value.transient is True
    assert info.value.detail["provider_error"] == "APIConnectionError"
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.detail["reason"]
    assert tls_provider.chat_requests() == []

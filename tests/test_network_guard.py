"""The network guard (tests/netguard.py, installed by conftest for every test)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import netguard

ROOT = Path(__file__).resolve().parent.parent


def caused_by_the_guard(error: BaseException | None) -> bool:
    """Whether ``error`` is, groups or wraps NetworkBlocked (anyio raises an
    ExceptionGroup from its happy-eyeballs task group)."""
    if error is None:
        return False
    if isinstance(error, netguard.NetworkBlocked):
        return True
    if isinstance(error, BaseExceptionGroup):
        return any(caused_by_the_guard(inner) for inner in error.exceptions)
    return caused_by_the_guard(error.__cause__ or error.__context__)


@pytest.fixture
def lookups(monkeypatch):
    """Names that reached the real getaddrinfo (which may ask a DNS server)."""
    seen: list[object] = []
    real = netguard._originals["getaddrinfo"]

    def spy(host, *args, **kwargs):
        seen.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setitem(netguard._originals, "getaddrinfo", spy)
    return seen


@pytest.fixture
def loopback_server():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_the_guard_is_installed():
    assert netguard.installed()


@pytest.mark.parametrize(
    ("family", "host"),
    [
        (socket.AF_INET, "127.0.0.1"),
        (socket.AF_INET, "127.5.6.7"),
        (socket.AF_INET, "localhost"),
        (socket.AF_INET6, "::1"),
        (socket.AF_INET6, "::ffff:127.0.0.1"),
    ],
)
def test_loopback_addresses_pass(family, host):
    netguard.check_address(family, (host, 80))


@pytest.mark.parametrize(
    ("family", "host"),
    [
        (socket.AF_INET, "10.255.255.1"),
        (socket.AF_INET, "0.0.0.0"),
        (socket.AF_INET, "8.8.8.8"),
        (socket.AF_INET, "example.invalid"),
        (socket.AF_INET, "localhost.example.com"),
        (socket.AF_INET6, "2001:db8::1"),
        (socket.AF_INET6, "::ffff:10.0.0.1"),
    ],
)
def test_other_addresses_are_blocked(family, host):
    with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked, match=host):
        netguard.check_address(family, (host, 80))


def test_a_socket_connect_beyond_loopback_fails():
    with (
        netguard.expect_blocked(),
        socket.socket() as sock,
        pytest.raises(netguard.NetworkBlocked, match=r"'10\.255\.255\.1', 80"),
    ):
        sock.connect(("10.255.255.1", 80))
    with (
        netguard.expect_blocked(),
        socket.socket() as sock,
        pytest.raises(netguard.NetworkBlocked, match=r"10\.255\.255\.1"),
    ):
        sock.connect_ex(("10.255.255.1", 80))


def test_the_error_is_not_an_oserror():
    # Code that handles refused connections (retries, error events) must not absorb it.
    assert not issubclass(netguard.NetworkBlocked, OSError)


def test_create_connection_to_a_name_makes_no_lookup(lookups):
    with (
        netguard.expect_blocked(),
        pytest.raises(netguard.NetworkBlocked, match=r"example\.invalid"),
    ):
        socket.create_connection(("example.invalid", 80), timeout=5)
    with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked):
        socket.getaddrinfo("example.invalid", 443)
    with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked):
        socket.gethostbyname("example.invalid")
    assert lookups == []


@pytest.mark.parametrize("url", ["http://10.255.255.1/", "http://example.invalid/v1/models"])
async def test_an_httpx_request_beyond_loopback_fails_at_once(url, lookups):
    started = time.monotonic()
    with netguard.expect_blocked(), pytest.raises(BaseException) as raised:
        async with httpx.AsyncClient(timeout=10) as client:
            await client.get(url)
    assert time.monotonic() - started < 2
    assert caused_by_the_guard(raised.value), raised.value
    assert lookups == []


async def test_asyncio_open_connection_beyond_loopback_fails(lookups):
    with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked):
        await asyncio.wait_for(asyncio.open_connection("10.255.255.1", 80), 5)
    with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked):
        await asyncio.wait_for(asyncio.open_connection("example.invalid", 80), 5)
    assert lookups == []


async def test_happy_eyeballs_connections_report_the_guard(lookups):
    # As chat.llm.netbackend connects. asyncio's staggered race would turn an error from
    # sock.connect into an IndexError; the guard stops the call before it starts.
    loop = asyncio.get_running_loop()
    for host in ("10.255.255.1", "example.invalid"):
        with netguard.expect_blocked(), pytest.raises(netguard.NetworkBlocked, match=host):
            await loop.create_connection(asyncio.Protocol, host, 80, happy_eyeballs_delay=0.25)
    assert lookups == []


async def test_asyncio_loopback_connections_work(loopback_server):
    loop = asyncio.get_running_loop()
    for host in ("127.0.0.1", "localhost"):
        transport, _ = await loop.create_connection(
            asyncio.Protocol, host, loopback_server, happy_eyeballs_delay=0.25
        )
        transport.close()


def test_loopback_connections_work(loopback_server):
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", loopback_server))
    with socket.create_connection(("localhost", loopback_server), timeout=5):
        pass
    assert socket.getaddrinfo("localhost", loopback_server)


def test_ipv6_loopback_works():
    # This machine kind has ::1 (Redis listens on it too); a missing one is a failure here.
    server = socket.create_server(("::1", 0), family=socket.AF_INET6)
    with server, socket.create_connection(("::1", server.getsockname()[1]), timeout=5):
        pass


def test_unix_sockets_work(tmp_path):
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)


async def test_httpx_to_a_loopback_server_works(fake_openai):
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{fake_openai.base_url}/models")
    assert response.status_code == 200


def test_a_fresh_run_ignores_provider_variables_and_fails_swallowed_attempts():
    env = {
        **os.environ,
        "LYCEUM_PROBE_MARKER": "set",
        "LYCEUM_OPENAI_BASE_URL": "http://10.255.255.1/v1",
        "LYCEUM_OPENAI_API_KEY": "sk-developer-0123456789",
        "LYCEUM_OPENAI_MODELS": "their-model",
        "OPENAI_API_KEY": "sk-developer-0123456789",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "tests/netguard_probe.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert "PASSED tests/netguard_probe.py::test_provider_environment_is_ignored" in output, output
    # The attempt was caught inside the test; the guard's check errors it at teardown.
    assert "ERROR tests/netguard_probe.py::test_a_swallowed_attempt_still_fails" in output, output
    assert "network guard: connect to ('10.255.255.1', 80) is not loopback" in output, output
    assert result.returncode == 1, output

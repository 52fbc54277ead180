"""§2 of issue 14: the socket's Origin is compared exactly (scheme, host and port)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat import actions
from chatsite.origins import normalize_origin, origin_allowed
from tests.hardening.sockets import adb, cookie_of, logged_in_client, open_socket

ROOT = Path(__file__).resolve().parents[2]


def scope(origin: str | None, host: str | None = "chat.example.org", *, scheme="wss", extra=()):
    headers = []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if host is not None:
        headers.append((b"host", host.encode()))
    headers += [(k.encode(), v.encode()) for k, v in extra]
    return {"type": "websocket", "scheme": scheme, "headers": headers}


@pytest.fixture
def prod_like(settings):
    settings.ALLOWED_HOSTS = ["chat.example.org", ".example.org"]
    settings.LYCEUM_TRUSTED_ORIGINS = ["https://chat.example.org"]
    settings.LYCEUM_TRUST_X_FORWARDED_PROTO = False


def test_origins_are_normalized_with_their_port():
    assert normalize_origin("HTTPS://Chat.Example.org") == "https://chat.example.org:443"
    assert normalize_origin("http://chat.example.org:80") == "http://chat.example.org:80"
    assert normalize_origin("http://[::1]:8000") == "http://[::1]:8000"
    for bad in (
        "null",
        "",
        "file://",
        "ws://x",
        "https://u:p@x",
        "https://x/path",
        "https://x:99999",
    ):
        assert normalize_origin(bad) is None, bad


@pytest.mark.parametrize(
    "origin,host,scheme,ok",
    [
        ("https://chat.example.org", "chat.example.org", "wss", True),  # listed
        ("https://chat.example.org:443", "chat.example.org", "wss", True),
        ("http://chat.example.org", "chat.example.org", "wss", False),  # other scheme
        ("https://chat.example.org:8443", "chat.example.org", "wss", False),  # other port
        ("https://evil.example.org", "chat.example.org", "wss", False),  # sibling subdomain
        ("https://chat.example.org.evil.test", "chat.example.org", "wss", False),
        ("null", "chat.example.org", "wss", False),
        (None, "chat.example.org", "wss", False),
        # The page's own origin (its Host) is accepted, port and scheme included ...
        ("https://other.example.org", "other.example.org", "wss", True),
        ("http://other.example.org:8000", "other.example.org:8000", "ws", True),
        # ... but not another port of it, nor a Host outside ALLOWED_HOSTS.
        ("http://other.example.org:8001", "other.example.org:8000", "ws", False),
        ("http://evil.test", "evil.test", "ws", False),
    ],
)
def test_origin_check(prod_like, origin, host, scheme, ok):
    assert origin_allowed(scope(origin, host, scheme=scheme)) is ok


def test_two_origin_headers_are_refused(prod_like):
    s = scope("https://chat.example.org")
    s["headers"].append((b"origin", b"https://evil.test"))
    assert not origin_allowed(s)


def test_x_forwarded_proto_counts_only_when_trusted(prod_like, settings):
    settings.LYCEUM_TRUSTED_ORIGINS = []
    behind_proxy = scope(
        "https://chat.example.org", scheme="ws", extra=[("x-forwarded-proto", "https")]
    )
    assert not origin_allowed(behind_proxy)
    settings.LYCEUM_TRUST_X_FORWARDED_PROTO = True
    assert origin_allowed(behind_proxy)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("socket_env")
@pytest.mark.parametrize(
    "origin,ok",
    [
        (b"http://localhost", True),  # trusted in the tests' settings
        (b"http://localhost:8001", False),
        (b"https://localhost", False),
        (b"http://sub.localhost", False),
        (b"null", False),
        (None, False),
    ],
)
async def test_the_asgi_application_checks_the_origin(alice, agent, origin, ok):
    chat = await adb(actions.new_chat)(alice, model="demo-fast")
    client = await adb(logged_in_client)(alice)
    socket, accepted, _code = await open_socket(
        cookie_of(client), f"/ws/chat/{chat.pk}/", origin=origin, resync=False
    )
    assert accepted is ok
    if accepted:
        await socket.close()


def _settings_check(**env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "DATABASE_URL", "LYCEUM_TRUSTED_ORIGINS"}
    }
    production = {
        "DEBUG": "0",
        "SECRET_KEY": "a-long-random-production-secret-key-0123456789-abcdefghijklmnopq",
        "ALLOWED_HOSTS": "lyceum.example.org",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**base, **production, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "env,message",
    [
        ({"ALLOWED_HOSTS": "*"}, "not '*'"),
        ({"CSRF_TRUSTED_ORIGINS": "https://*.example.org"}, "wildcard"),
        ({"LYCEUM_TRUSTED_ORIGINS": "https://*.example.org"}, "wildcard"),
        ({"LYCEUM_TRUSTED_ORIGINS": "null"}, "origins like"),
    ],
)
def test_a_wildcard_or_null_origin_stops_start_up_outside_debug(env, message):
    result = _settings_check(**env)
    assert result.returncode != 0
    assert message in result.stderr


def test_exact_origins_start_up():
    result = _settings_check(LYCEUM_TRUSTED_ORIGINS="https://lyceum.example.org")
    assert result.returncode == 0, result.stderr


def test_debug_is_off_unless_asked_for():
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr

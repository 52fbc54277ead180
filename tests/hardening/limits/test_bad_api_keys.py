"""§4 of issue 14: bad API keys are throttled per address, on the API and the relay.

Once an address is shut, a bad key from it costs no key lookup. Marked ``persistence``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client

from chat import apikeys, throttle
from chat.relay import asgi as relay_asgi

pytestmark = [pytest.mark.persistence]

BAD = "lyk_" + "x" * 43


@pytest.fixture
def key_limits(settings):
    settings.LYCEUM_BAD_KEY_ATTEMPTS = 3
    settings.LYCEUM_BAD_KEY_LOCKOUT_MINUTES = 10
    return settings


@pytest.fixture
def lookups(monkeypatch) -> list[str]:
    """Every API key looked up in the database, by the API and by the relay."""
    seen: list[str] = []
    real = apikeys.authenticate_api_key

    def counted(raw: str):
        seen.append(raw)
        return real(raw)

    monkeypatch.setattr("chat.relay.service.authenticate_api_key", counted)
    monkeypatch.setattr("chat.apikeys.authenticate_api_key", counted)
    return seen


def api_get(key: str, address: str = "203.0.113.5", path: str = "/api/v1/models"):
    return Client(REMOTE_ADDR=address).get(path, HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.django_db(transaction=True)
def test_the_api_shuts_an_address_after_three_bad_keys(alice, counters, key_limits, lookups, clock):
    for n in range(3):
        response = api_get(f"{BAD}{n}")
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"

    refused = api_get(BAD + "x")

    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 600
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert "Too many requests with a wrong API key from your address" in error["message"]
    looked_up = len(lookups)
    for n in range(10):
        assert api_get(f"{BAD}{n}y").status_code == 429
    assert len(lookups) == looked_up  # a shut address costs no lookup
    # Another address is not shut; the lockout ends.
    good = apikeys.create_api_key(alice, "ok")[1]
    assert api_get(good, address="198.51.100.9").status_code == 200
    clock.advance(601)
    assert api_get(good).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_missing_key_is_not_counted(alice, counters, key_limits):
    for _ in range(6):
        assert Client().get("/api/v1/models").status_code == 401
    good = apikeys.create_api_key(alice, "ok")[1]
    assert api_get(good, address="127.0.0.1").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_relay_answers_in_openais_shape_and_looks_nothing_up_once_shut(
    alice, counters, key_limits, lookups
):
    for n in range(3):
        assert api_get(f"{BAD}{n}", path="/api/v1/relay/models").status_code == 401

    refused = api_get(BAD, path="/api/v1/relay/models")

    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 600
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    looked_up = len(lookups)
    for n in range(5):
        assert api_get(f"{BAD}{n}z", path="/api/v1/relay/models").status_code == 429
    assert len(lookups) == looked_up


async def _asgi_get(path: str, key: str, client: tuple[str, int]) -> tuple[int, dict, dict]:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "scheme": "http",
        "query_string": b"",
        "client": client,
        "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {key}".encode())],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await relay_asgi.app(scope, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(sent[1]["body"])


@pytest.mark.django_db(transaction=True)
async def test_the_relays_own_asgi_door_shuts_too_but_a_good_key_in_memory_still_works(
    alice, counters, key_limits, lookups
):
    from channels.db import database_sync_to_async

    good = (await database_sync_to_async(apikeys.create_api_key)(alice, "ok"))[1]
    where = ("192.0.2.44", 5000)
    status, _, _ = await _asgi_get("/api/v1/relay/models", good, where)
    assert status == 200  # the good key is now held in memory
    for n in range(3):
        status, _, body = await _asgi_get("/api/v1/relay/models", f"{BAD}{n}", where)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"

    status, headers, body = await _asgi_get("/api/v1/relay/models", BAD + "q", where)

    assert status == 429 and int(headers["retry-after"]) == 600
    assert body["error"]["code"] == "rate_limit_exceeded"
    looked_up = len(lookups)
    status, _, _ = await _asgi_get("/api/v1/relay/models", BAD + "r", where)
    assert status == 429 and len(lookups) == looked_up
    status, _, _ = await _asgi_get("/api/v1/relay/models", good, where)
    assert status == 200


@pytest.mark.django_db(transaction=True)
def test_thirty_bad_keys_at_once_let_exactly_the_allowed_three_through(counters, key_limits):
    def one(_: int) -> bool:
        try:
            return throttle.bad_key("203.0.113.77") is None
        finally:
            connection.close()

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(one, range(30)))

    assert answers.count(True) == 3


def test_the_relays_asgi_door_reads_the_address_like_django_does(settings):
    scope = {"client": ("10.0.0.1", 5555)}
    headers = {b"x-forwarded-for": b"6.6.6.6, 192.0.2.8"}
    settings.LYCEUM_CLIENT_ADDRESS_HEADER = ""
    assert throttle.scope_address(scope, headers) == "10.0.0.1"
    settings.LYCEUM_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    assert throttle.scope_address(scope, headers) == "192.0.2.8"

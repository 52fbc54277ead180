"""The relay's raw ASGI app in front of Django, and its batch writer of usage records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.models import UsageRecord
from chat.relay import writer as writer_module
from chat.relay.writer import Item, UsageWriter


async def call(path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None):
    from chatsite.asgi import http_app

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "scheme": "http",
        "headers": headers if headers is not None else [(b"host", b"127.0.0.1")],
    }
    await http_app(scope, receive, send)
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


async def test_the_relay_routes_answer_without_django_in_openai_shape():
    status, headers, body = await call("/api/v1/relay/models")
    assert status == 401 and headers[b"www-authenticate"] == b"Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert b"vary" not in headers  # no session or other middleware touched it
    status, headers, body = await call("/api/v1/relay/chat/completions", "GET")
    assert status == 405 and headers[b"allow"] == b"POST"
    assert json.loads(body)["error"]["code"] == "method_not_allowed"


async def test_a_host_outside_allowed_hosts_is_refused(settings):
    settings.ALLOWED_HOSTS = ["lyceum.example"]
    status, _headers, body = await call(
        "/api/v1/relay/models", headers=[(b"host", b"evil.example")]
    )
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_host"


async def test_plain_http_is_redirected_when_asked(settings):
    settings.SECURE_SSL_REDIRECT = True
    status, headers, _body = await call("/api/v1/relay/models")
    assert status == 301 and headers[b"location"] == b"https://127.0.0.1/api/v1/relay/models"


@pytest.mark.django_db(transaction=True)
def test_the_writer_keeps_what_fails_and_writes_the_rest(alice):
    kept = UsageWriter()
    kept.add(Item(UsageRecord(user=alice, model="m", status="ok", prompt_tokens=3)))
    kept.add(Item(UsageRecord(user_id=987654, model="m", status="ok")))  # no such user
    kept.add(Item(UsageRecord(user=alice, model="m", status="ok", prompt_tokens=4)))
    assert kept.flush() == 2
    assert sorted(UsageRecord.objects.values_list("prompt_tokens", flat=True)) == [3, 4]
    assert kept.pending() == 1  # kept for the next flush, not dropped


@pytest.mark.django_db(transaction=True)
def test_the_process_writer_flushes_on_demand_and_at_exit(alice):
    writer_module.writer.add(Item(UsageRecord(user=alice, model="m", status="ok")))
    writer_module._flush_at_exit()
    assert UsageRecord.objects.count() == 1 and writer_module.writer.pending() == 0
    writer_module.writer.add(Item(UsageRecord(user=alice, model="m", status="ok")))
    assert writer_module.flush() == 1

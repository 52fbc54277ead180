"""The API answers JSON when its first database call, the key lookup, fails (found by
bench/soak.py: PostgreSQL out of connections gave Django's HTML error page)."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.test import Client

from chat.api import views
from chat.apikeys import create_api_key
from chat.models import ChatSession

pytestmark = pytest.mark.django_db(transaction=True)


def _failing_lookup(raw: str):
    raise OperationalError("connection failed: FATAL:  sorry, too many clients already")


@pytest.mark.parametrize(
    "method, path",
    [
        ("post", "/api/v1/chat/stream"),
        ("post", "/api/v1/chat"),
        ("get", "/api/v1/models"),
    ],
)
def test_a_failed_key_lookup_is_a_json_error(alice, monkeypatch, method, path):
    _key, raw = create_api_key(alice)
    monkeypatch.setattr(views, "authenticate_key", _failing_lookup)
    client = Client(raise_request_exception=False)
    response = getattr(client, method)(
        path,
        data='{"message": "hello"}' if method == "post" else None,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 503  # out of connections: worth a retry shortly
    assert response["Retry-After"] == "5"
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "service_unavailable"
    assert error["message"] == (
        "The server cannot reach its database just now; try again in a few seconds."
    )
    assert "too many clients" not in response.content.decode()
    assert not ChatSession.objects.filter(owner=alice).exists()  # nothing half-written


def test_a_database_failure_inside_a_view_is_a_503(alice, monkeypatch):
    _key, raw = create_api_key(alice)

    def out_of_connections(*args, **kwargs):
        raise OperationalError("FATAL:  sorry, too many clients already")

    monkeypatch.setattr(views.actions, "start_chat_and_send", out_of_connections)
    client = Client(raise_request_exception=False)
    response = client.post(
        "/api/v1/chat",
        data='{"message": "hello"}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    assert not ChatSession.objects.filter(owner=alice).exists()


def test_a_bad_key_is_still_a_401(alice, bob):
    _key, raw = create_api_key(bob)
    client = Client()
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}x")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"

"""An API request's own database connection is closed when the request ends
(chat/requestdb.py). Found by bench/soak.py: under ASGI each request runs its
database calls in a thread of its own, and with persistent connections each left a
connection open; PostgreSQL ran out of them ("too many clients")."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from django.core.asgi import get_asgi_application
from django.db import connection
from django.db.backends.signals import connection_created

from chat.apikeys import create_api_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def persistent_connections() -> Iterator[None]:
    """CONN_MAX_AGE as in production (the test settings may close them anyway)."""
    before = connection.settings_dict.get("CONN_MAX_AGE")
    connection.settings_dict["CONN_MAX_AGE"] = 60
    try:
        yield
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = before


@pytest.fixture
def opened() -> Iterator[list]:
    """Every database connection opened meanwhile, in any thread."""
    made: list = []

    def created(sender, connection, **kwargs) -> None:
        made.append(connection)

    connection_created.connect(created, weak=False)
    try:
        yield made
    finally:
        connection_created.disconnect(created)


async def _get(path: str, key: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=get_asgi_application())  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await client.get(path, headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize(
    "path", ["/api/v1/models", "/api/v1/chat/00000000-0000-0000-0000-000000000000/runs/x"]
)
async def test_an_api_request_leaves_no_connection_open(
    alice, persistent_connections, opened, path
):
    from channels.db import database_sync_to_async

    _key, raw = await database_sync_to_async(create_api_key)(alice)
    opened.clear()
    for _ in range(3):
        response = await _get(path, raw)
        assert response.status_code in (200, 400, 404), response.text
    assert len(opened) == 3  # one per request, in the request's own thread
    assert [c.connection for c in opened] == [None, None, None]  # each closed at its end

"""§5 (part) The API (issue 15): GET /api/v1/models, and unknown API paths answer JSON."""

from __future__ import annotations

import pytest

from chat.apikeys import create_api_key

pytestmark = pytest.mark.django_db(transaction=True)  # async views use another thread


def test_models_lists_what_the_caller_may_use(client, alice):
    _key, secret = create_api_key(alice, "script")
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert {m["id"] for m in body["data"]} >= {"demo", "demo-fast"}
    assert all(m["object"] == "model" and m["context_window"] > 0 for m in body["data"])

    assert client.get("/api/v1/models").status_code == 401
    refused = client.post("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert refused.status_code == 405 and refused.json()["error"]["type"] == "method_not_allowed"


@pytest.mark.parametrize(
    "path", ["/api/v1/nothing-here", "/api/v1/chat/x/y/z/w", "/api/v2/models", "/api/", "/api"]
)
def test_unknown_api_paths_answer_json_404(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["type"] == "not_found"

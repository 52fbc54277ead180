"""§6: SSE events carry ids; a client cut off resumes with Last-Event-ID and gets every
event after it, none twice."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from chat.apikeys import create_api_key
from chat.runhost import executor

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Please give me a long answer about rivers."


def parse_sse(body: bytes) -> list[tuple[str | None, str | None, dict]]:
    """(id, event name, data) of each SSE event (comments skipped)."""
    out = []
    for block in body.decode().split("\n\n"):
        event_id = name = data = None
        for line in block.split("\n"):
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((event_id, name, data))
    return out


async def read(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def text_of(events) -> str:
    return "".join(d["text"] for _i, _n, d in events if d["type"] == "delta")


@pytest.fixture
def alice_key(alice) -> str:
    return create_api_key(alice, "t")[1]


@pytest.fixture
async def api(alice_key, default_agent, settings, tmp_path):
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.001
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.01
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.02
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}}
    client = AsyncClient()
    client.auth = {"Authorization": f"Bearer {alice_key}"}
    yield client
    await executor.stop_all()


async def test_every_event_has_an_id_and_a_resume_from_each_gives_the_rest_once(api):
    response = await api.post(
        "/api/v1/chat/stream",
        {"message": PROMPT, "model": "demo"},  # paced (1 ms a token): the reply comes in pieces
        content_type="application/json",
        headers=api.auth,
    )
    assert response.status_code == 200
    events = parse_sse(await read(response))
    assert events and all(event_id for event_id, _n, _d in events)
    session, run_id = response["X-Lyceum-Session"], events[-1][2]["run_id"]
    assert events[-1][2]["type"] == "complete"
    full_text = events[-1][2]["text"]
    assert text_of(events) == full_text
    deltas = [i for i, (_e, _n, d) in enumerate(events) if d["type"] == "delta"]
    assert len(deltas) > 2

    # Cut off after the first event, in the middle of the reply, and just before the end.
    for cut in sorted({0, deltas[0], deltas[len(deltas) // 2], len(events) - 2}):
        response = await api.get(
            f"/api/v1/chat/{session}/runs/{run_id}/stream",
            headers={**api.auth, "Last-Event-ID": events[cut][0]},
        )
        assert response.status_code == 200
        rest = parse_sse(await read(response))
        seen = events[: cut + 1] + rest
        assert text_of(seen) == full_text, cut
        logged = [d["seq"] for _i, _n, d in seen if d["type"] not in ("delta", "thinking_delta")]
        assert len(logged) == len(set(logged)), cut  # no log event twice
        assert [d["type"] for _i, _n, d in seen].count("complete") == 1

    # Without the header: the whole run again.
    response = await api.get(f"/api/v1/chat/{session}/runs/{run_id}/stream", headers=api.auth)
    again = parse_sse(await read(response))
    assert text_of(again) == full_text and again[-1][2]["type"] == "complete"


async def test_a_bad_last_event_id_is_a_json_400(api):
    response = await api.post(
        "/api/v1/chat/stream",
        {"message": "hi", "model": "demo-fast"},
        content_type="application/json",
        headers=api.auth,
    )
    events = parse_sse(await read(response))
    session, run_id = response["X-Lyceum-Session"], events[-1][2]["run_id"]
    response = await api.get(
        f"/api/v1/chat/{session}/runs/{run_id}/stream",
        headers={**api.auth, "Last-Event-ID": "twelve"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"

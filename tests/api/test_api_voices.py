"""The API streams a run with several voices as deltas that name their speaker."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from chat.apikeys import create_api_key
from chat.catalog import PANEL_PERSONAS, ensure_panel_agent
from chat.models import ChatEvent

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live(settings, request, default_agent) -> str:
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.01
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.05
    return request.getfixturevalue("live_server_url")


def test_deltas_of_each_speaker_spell_that_speakers_message(live, alice):
    ensure_panel_agent()
    key = create_api_key(alice, "tests")[1]
    body = {"message": "two voices: what is a prime?", "agent": "panel", "model": "demo"}
    events: list[dict[str, Any]] = []
    with (
        httpx.Client(base_url=live, timeout=30) as client,
        client.stream(
            "POST", "/api/v1/chat/stream", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["type"] == "complete"
    spelled: dict[str, str] = {}
    for event in events:
        if event["type"] == "delta":
            assert event["speaker"] in PANEL_PERSONAS, event
            spelled[event["speaker"]] = spelled.get(event["speaker"], "") + event["text"]
    written = {
        e.payload["sender_name"]: e.payload["content"]
        for e in ChatEvent.objects.filter(channel="display", kind="msg")
        if e.payload.get("role") == "assistant"
    }
    assert set(written) == set(PANEL_PERSONAS)
    assert spelled == written
    assert all("<" not in text for text in spelled.values())

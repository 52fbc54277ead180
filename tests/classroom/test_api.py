"""Seed 001's classroom commands over HTTP, against a live server and the demo model."""

from __future__ import annotations

import httpx
import pytest

from chat.apikeys import create_api_key
from classroom import actions
from tests.api.test_api import auth, data_lines

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = {"id", "agent_id", "agent_name", "agent_avatar", "content", "timestamp", "role", "color"}


@pytest.fixture
def setup(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo")
    actions.save_scene(teacher, room.pk, title="Equations", content="# x")
    student = make_user("sam")
    actions.join_classroom(student, room.join_code)
    return room, create_api_key(student, "t")[1]


@pytest.fixture
def live(settings, request):
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.005
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.05
    return request.getfixturevalue("live_server_url")


def test_chat_returns_the_learner_message_and_the_persona_replies(setup, live):
    room, key = setup
    with httpx.Client(base_url=live, timeout=30, headers=auth(key)) as client:
        response = client.post(
            f"/api/v1/classrooms/{room.pk}/chat",
            json={"user_message": "I need a hint", "scene_context": "Slide 3: 2x + 1 = 7"},
        )
        assert response.status_code == 200, response.text
        messages = response.json()
        assert [set(m) for m in messages] == [FIELDS] * 3
        assert [(m["agent_id"], m["agent_name"], m["role"]) for m in messages] == [
            ("user", "You", "user"),
            (str(room.personas.get(name="Ada").pk), "Ada", "teacher"),
            (str(room.personas.get(name="Theo").pk), "Theo", "assistant"),
        ]
        assert messages[0]["content"] == "I need a hint"
        assert "Equations" in messages[1]["content"]
        assert messages[1]["color"] == "#7c3aed" and messages[1]["agent_avatar"]
        assert all(m["id"].startswith("msg_") and m["timestamp"] > 1e12 for m in messages)

        history = client.get(f"/api/v1/classrooms/{room.pk}/history").json()
        assert history == messages

        second = client.post(f"/api/v1/classrooms/{room.pk}/chat", json={"user_message": "ok"})
        assert [m["agent_name"] for m in second.json()] == ["You", "Ada", "Maya"]
        assert (
            client.get(f"/api/v1/classrooms/{room.pk}/history").json() == messages + second.json()
        )
        bad = client.post(f"/api/v1/classrooms/{room.pk}/chat", json={"user_message": " "})
        assert bad.status_code == 400


def test_stream_gives_each_personas_deltas_with_its_agent_id(setup, live):
    room, key = setup
    with (
        httpx.Client(base_url=live, timeout=30, headers=auth(key)) as client,
        client.stream(
            "POST",
            f"/api/v1/classrooms/{room.pk}/chat/stream",
            json={"user_message": "let's discuss, everyone"},
        ) as response,
    ):
        assert response.status_code == 200
        events = list(data_lines(response))
    assert events[0]["type"] == "message" and events[0]["message"]["agent_id"] == "user"
    assert events[-1]["type"] == "complete"
    final = events[-1]["messages"]
    assert [m["agent_name"] for m in final] == ["You", "Ada", "Maya", "Leo"]
    deltas = [e for e in events if e["type"] == "delta"]
    assert len(deltas) > 6  # streamed, not written at once
    for message in final[1:]:
        spelled = "".join(d["text"] for d in deltas if d["agent_id"] == message["agent_id"])
        assert spelled == message["content"]
        assert {d["agent_name"] for d in deltas if d["agent_id"] == message["agent_id"]} == {
            message["agent_name"]
        }
    written = [e["message"] for e in events[1:] if e["type"] == "message"]
    assert written == final[1:]

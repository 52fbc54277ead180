"""§5 of issue 14: a fuzz test (hypothesis) over the API's JSON body and the socket's
frames. Never a 500, never an unhandled exception, no row written on a refusal.

Runs go nowhere here (``launch_on_commit`` is a no-op): what is checked is how the
request is taken in, not the run it starts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat import actions
from chat.apikeys import create_api_key
from chat.models import ChatEvent, ChatSession, QueuedInput, Run
from tests.hardening.sockets import cookie_of, logged_in_client, open_socket

pytestmark = [pytest.mark.persistence, pytest.mark.django_db(transaction=True)]

SPECIAL = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "demo", "demo-fast", "default", "💥" * 3]
)
TEXT = st.one_of(SPECIAL, st.text(max_size=20))
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "message": JSON,
        "session_id": JSON,
        "agent": JSON,
        "model": JSON,
        "thinking": JSON,
    },
)


def _dump(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


BODY = st.one_of(
    FIELDS.map(_dump),
    JSON.map(_dump),
    st.binary(max_size=40),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
)


def counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (ChatSession, ChatEvent, QueuedInput, Run))


@pytest.fixture
def quiet_runs(monkeypatch, settings, tmp_path):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    monkeypatch.setattr(actions, "launch_on_commit", lambda *a, **k: None)


def test_fuzz_the_api_body(alice, agent, quiet_runs, caplog):
    key = create_api_key(alice, "fuzz")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    @hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=BODY)
    def check(body):
        caplog.clear()
        before = counts()
        with caplog.at_level(logging.ERROR):
            response = client.post("/api/v1/chat/stream", body, content_type="application/json")
        assert response.status_code in (200, 400, 404, 413), (response.status_code, body)
        assert response["Content-Type"] in ("application/json", "text/event-stream")
        if response.status_code != 200:
            assert counts() == before, body
        response.close()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], body

    check()


FRAME_FIELDS = st.fixed_dictionaries(
    {"action": st.one_of(st.sampled_from(["send", "resync", "approve", "switch_model"]), JSON)},
    optional={
        "message": JSON,
        "client_id": JSON,
        "call_id": JSON,
        "model": JSON,
        "last_seq": JSON,
        "reason": JSON,
    },
)
FRAME = st.one_of(FRAME_FIELDS.map(_dump), JSON.map(_dump), st.text(min_size=1, max_size=30))


def test_fuzz_the_socket_frames(alice, agent, quiet_runs, caplog, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}}
    chat = actions.new_chat(alice, model="demo-fast")
    cookie = cookie_of(logged_in_client(alice))

    async def exchange(frames: list[str]) -> None:
        socket, ok, code = await open_socket(cookie, f"/ws/chat/{chat.pk}/")
        assert ok, code
        await socket.drain(0.05)
        for frame in frames:
            await socket.send_raw(frame)
            await socket.drain(0.02)
        # The consumer is alive: it still answers.
        await socket.send(action="nope")
        await socket.until("nope")
        await socket.close()

    @hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames=st.lists(FRAME, min_size=1, max_size=6))
    def check(frames):
        caplog.clear()
        before = counts()
        with caplog.at_level(logging.ERROR):
            async_to_sync(exchange)(frames)
        accepted = [
            f
            for f in frames
            if (lambda d: isinstance(d, dict) and d.get("action") == "send")(_loads(f))
        ]
        if not accepted:
            assert counts() == before
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], frames

    check()


def _loads(frame: str) -> Any:
    try:
        return json.loads(frame)
    except ValueError:
        return None

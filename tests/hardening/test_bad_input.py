"""§5 of issue 14: bad input never reaches a 500, and nothing half-written is left.

Marked ``persistence``: ``make test`` runs these again on PostgreSQL, which refuses
NUL characters and lone surrogates that SQLite would store.
"""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from chat import actions
from chat.apikeys import create_api_key
from chat.models import ChatEvent, ChatSession, QueuedInput, Run, ToolApproval
from tests.hardening.sockets import adb, chat_socket, cookie_of, logged_in_client, open_socket

pytestmark = [pytest.mark.persistence, pytest.mark.django_db(transaction=True)]

DEEP = "[" * 100_000 + "]" * 100_000
BAD_BODIES = {
    "deep": DEEP,
    "deep object": '{"message": ' + "[" * 5000 + "]" * 5000 + "}",
    "nested past the limit": '{"message": "hi", "x": ' + "[" * 40 + "]" * 40 + "}",
    "lone surrogate": '{"message": "hi \\ud800 there"}',
    "NUL": '{"message": "hi \\u0000 there"}',
    "NUL in a key": '{"message": "hi", "a\\u0000": 1}',
    "NUL in the model": '{"message": "hi", "model": "demo\\u0000"}',
    "NUL in the agent": '{"message": "hi", "agent": "x\\u0000"}',
    "NUL in the session": '{"message": "hi", "session_id": "\\u0000"}',
    "wrong type": '{"message": ["hi"]}',
    "wrong type thinking": '{"message": "hi", "thinking": "yes"}',
    "huge int": '{"message": "hi", "thinking": ' + "9" * 40 + "}",
    "too many digits": '{"message": "hi", "n": ' + "9" * 5000 + "}",
    "infinite": '{"message": "hi", "n": 1e999}',
    "NaN": '{"message": "hi", "n": NaN}',
    "not an object": "[1, 2]",
    "not JSON": "{message: hi}",
    "not UTF-8": b'{"message": "\xff\xfe"}',
}


def counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (ChatSession, ChatEvent, QueuedInput, Run))


@pytest.fixture
def api(alice, agent, settings, tmp_path):
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    key = create_api_key(alice, "tests")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.parametrize("path", ["/api/v1/chat", "/api/v1/chat/stream"])
@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_a_bad_body_is_a_400_and_writes_nothing(api, path, name, caplog):
    body = BAD_BODIES[name]
    before = counts()
    with caplog.at_level(logging.ERROR):
        response = api.post(path, body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert counts() == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", ["deep", "lone surrogate", "NUL", "wrong type thinking"])
def test_bad_bodies_on_the_approval_endpoint(api, alice, name):
    chat = actions.new_chat(alice, model="demo-fast")
    response = api.post(
        f"/api/v1/chat/{chat.pk}/approvals/call_1",
        BAD_BODIES[name],
        content_type="application/json",
    )
    assert response.status_code in (400, 404), response.content[:300]
    assert "error" in response.json()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/chat/%00/cancel",
        "/api/v1/chat/%ED%A0%80/cancel",
        "/api/v1/chat/not-a-uuid/cancel",
        "/api/v1/chat/00000000-0000-0000-0000-000000000000/approvals/%00",
        "/api/v1/chat/00000000-0000-0000-0000-000000000000/runs/%00",
    ],
)
def test_bad_ids_in_the_url_are_refused_as_json(api, path):
    method = api.get if "/runs/" in path else api.post
    response = method(path, content_type="application/json")
    assert response.status_code in (400, 404), response.content[:300]
    assert "error" in response.json()


def test_an_unexpected_error_is_json_not_an_html_page(api, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(actions, "cancel_run", broken)
    response = api.post(
        "/api/v1/chat/00000000-0000-0000-0000-000000000000/cancel",
        content_type="application/json",
    )
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["type"] == "internal_error"
    assert "database" not in response.json()["error"]["message"]


# --- the socket --------------------------------------------------------------------------


BAD_FRAMES = [
    DEEP,
    '{"action": "send", "message": "hi \\ud800", "client_id": "c-1"}',
    '{"action": "send", "message": "hi \\u0000", "client_id": "c-1"}',
    '{"action": "send", "message": "hi", "client_id": "c\\u0000"}',
    '{"action": "send", "message": {"x": 1}, "client_id": "c-1"}',
    '{"action": "send", "message": "hi", "client_id": 12}',
    '{"action": "approve", "call_id": "\\u0000"}',
    '{"action": "approve", "call_id": ["x"]}',
    '{"action": "switch_model", "model": "demo\\u0000"}',
    '{"action": "resync", "last_seq": 1e999}',
    '{"action": "resync", "last_seq": ' + "9" * 40 + "}",
    '{"action": ["send"]}',
    '{"action": "\\u0000"}',
    "[1]",
    "not json",
]


@pytest.mark.usefixtures("socket_env")
async def test_bad_frames_get_a_notice_write_nothing_and_leave_the_socket_usable(alice, agent):
    chat = await adb(actions.new_chat)(alice, model="demo-fast")
    client = await adb(logged_in_client)(alice)
    socket = await chat_socket(cookie_of(client), chat.pk)
    before = await adb(counts)()
    for frame in BAD_FRAMES:
        await socket.send_raw(frame)
        if '"resync"' in frame:
            # A cursor of 1e999 reads as "from the start" (a resync, not an error); one too
            # large to store is refused. Either way nothing is written.
            await socket.drain()
            continue
        answer = await socket.receive()
        assert 'id="notice"' in answer, (frame[:80], answer[:200])
    await socket.drain()
    assert await adb(counts)() == before
    assert not await ToolApproval.objects.aexists()
    # Still usable.
    await socket.send(action="send", message="a real one", client_id="c-ok")
    await socket.until("a real one")
    await socket.close()


@pytest.mark.usefixtures("socket_env")
@pytest.mark.parametrize(
    "path", ["/ws/nowhere/", "/ws/chat/not-a-uuid/", "/ws/chat/%00/", "/ws/chat/"]
)
async def test_unknown_socket_paths_are_refused_without_a_traceback(alice, path, caplog):
    client = await adb(logged_in_client)(alice)
    with caplog.at_level(logging.WARNING):
        _socket, ok, code = await open_socket(cookie_of(client), path, resync=False)
    assert (ok, code) == (False, 4404)
    assert not [r for r in caplog.records if r.exc_info]

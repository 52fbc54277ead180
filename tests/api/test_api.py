"""The agent API: API keys, JSON and Server-Sent Events over real HTTP, and error envelopes.

The HTTP tests talk to a forked Daphne (``live_server_url``) with httpx, reading the event
stream as a client would. The demo model streams with a small delay (set before the
server forks) so replies arrive as several coalesced snapshots, not in one piece.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async
from django.apps import apps
from django.core.management import call_command
from django.test import AsyncClient
from django.utils import timezone

from chat import actions
from chat.agent.events import TERMINAL_TYPES, event_from_dict
from chat.apikeys import authenticate_key, create_api_key
from chat.models import ApiKey, QueuedInput, Run, ToolApproval

pytestmark = pytest.mark.django_db(transaction=True)

DELTAS = ("delta", "thinking_delta")


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def alice_key(alice) -> str:
    return create_api_key(alice, "tests")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return create_api_key(bob, "tests")[1]


@pytest.fixture
def live(settings, request, default_agent) -> str:
    """A live server whose demo model streams in many small snapshots (set before the fork)."""
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.01
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.05
    return request.getfixturevalue("live_server_url")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def data_lines(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Each ``data:`` line of an event stream as the JSON object it carries."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])
        else:
            assert line == "" or line.startswith((":", "id: ")), line  # ids: resumable


def stream(base: str, key: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict]]:
    with (
        httpx.Client(base_url=base, timeout=30) as client,
        client.stream("POST", "/api/v1/chat/stream", json=body, headers=auth(key)) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return r, list(data_lines(r))


def check_stream(events: list[dict[str, Any]]) -> str:
    """The invariants of every run's event stream; returns the text the deltas spelled."""
    assert events
    for event in events:
        event_from_dict(event)  # a known type with only its own fields
    assert len({e["run_id"] for e in events}) == 1
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    stored = [e["seq"] for e in events if e["type"] not in DELTAS]
    assert stored == sorted(set(stored))  # strictly increasing
    assert [e["type"] in TERMINAL_TYPES for e in events].count(True) == 1
    assert events[-1]["type"] in TERMINAL_TYPES
    return "".join(e["text"] for e in events if e["type"] == "delta")


def all_database_text() -> str:
    """Every row of every model, as text (to prove a secret is stored nowhere)."""
    dump = []
    for model in apps.get_models():
        dump += [json.dumps(row, default=str) for row in model.objects.values()]
    return "\n".join(dump)


# --- API keys ----------------------------------------------------------------------------------


def test_create_api_key_prints_the_key_on_the_last_line_and_stores_only_its_hash(alice):
    out = StringIO()
    call_command("create_api_key", "alice", "--name", "laptop", stdout=out)
    raw = out.getvalue().strip().splitlines()[-1]

    assert raw.startswith("lyk_") and " " not in raw and len(raw) > 40
    key = ApiKey.objects.get(user=alice)
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.name == "laptop" and raw.startswith(key.prefix)
    assert raw not in all_database_text()
    assert authenticate_key(raw) == alice
    assert authenticate_key(raw + "x") is None


def test_create_api_key_refuses_an_unknown_user(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No user named"):
        call_command("create_api_key", "nobody", stdout=StringIO())
    assert not ApiKey.objects.exists()


def test_a_revoked_key_is_refused_over_http(alice, alice_key, live):
    ApiKey.objects.filter(user=alice).update(revoked_at=timezone.now())
    response = httpx.post(f"{live}/api/v1/chat", json={"message": "hi"}, headers=auth(alice_key))
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


# --- JSON --------------------------------------------------------------------------------------


def test_json_chat_returns_the_reply_usage_and_session_and_continues_it(alice, alice_key, live):
    with httpx.Client(base_url=live, timeout=30, headers=auth(alice_key)) as client:
        first = client.post("/api/v1/chat", json={"message": "hello from a script"})
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["status"] == "completed"
        assert "hello from a script" in body["reply"]
        assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
        session_id = body["session_id"]

        second = client.post(
            "/api/v1/chat",
            json={"message": "and again", "session_id": session_id, "model": "demo-fast"},
        )
        assert second.status_code == 200, second.text
        assert second.json()["session_id"] == session_id
        assert "and again" in second.json()["reply"]
    finished = Run.objects.filter(chat_id=session_id).order_by("started_at")
    assert [r.status for r in finished] == ["completed", "completed"]
    assert [r.model for r in finished] == ["demo", "demo-fast"]


def test_null_fields_mean_not_given(alice, alice_key, live):
    body = {"message": "hi", "thinking": None, "model": None, "session_id": None, "agent": None}
    response = httpx.post(f"{live}/api/v1/chat", json=body, headers=auth(alice_key), timeout=30)
    assert response.status_code == 200, response.text
    assert Run.objects.get(pk=response.json()["run_id"]).thinking is True


def test_json_chat_answers_202_with_the_approvals_a_run_waits_for(alice, alice_key, live):
    with httpx.Client(base_url=live, timeout=30, headers=auth(alice_key)) as client:
        response = client.post("/api/v1/chat", json={"message": "write file notes.md"})
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["status"] == "waiting_for_approval"
        (pending,) = body["approvals"]
        assert pending["name"] == "write_file"
        assert json.loads(pending["arguments"])["path"] == "notes.md"

        decided = client.post(
            f"/api/v1/chat/{body['session_id']}/approvals/{pending['call_id']}",
            json={"decision": "deny", "reason": "not today"},
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "denied"
        again = client.post(  # idempotent: the answer stands
            f"/api/v1/chat/{body['session_id']}/approvals/{pending['call_id']}",
            json={"decision": "approve"},
        )
        assert again.json()["status"] == "denied"

        # A JSON client follows the run it answered for until it is done.
        run_url = f"/api/v1/chat/{body['session_id']}/runs/{body['run_id']}"
        deadline = time.monotonic() + 30  # a ceiling for a busy machine; it takes ~1 s
        while time.monotonic() < deadline:
            summary = client.get(run_url).json()
            if summary["status"] == "completed":
                break
            time.sleep(0.05)
        assert summary["status"] == "completed", summary
        assert "not today" in summary["reply"]
        assert summary["usage"]["output_tokens"] > 0

        # The run went on without the tool; the next message gets its own reply.
        follow_up = client.post(
            "/api/v1/chat", json={"message": "thanks anyway", "session_id": body["session_id"]}
        )
        assert follow_up.status_code == 200, follow_up.text
    first_run = Run.objects.get(pk=body["run_id"])
    assert first_run.status == Run.Status.COMPLETED
    assert ToolApproval.objects.get(call_id=pending["call_id"]).reason == "not today"


# --- Server-Sent Events ------------------------------------------------------------------------


def test_the_event_stream_carries_the_whole_run_in_order(alice, alice_key, live):
    response, events = stream(live, alice_key, {"message": "calculate 12*7 please"})

    text = check_stream(events)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "complete"
    assert response.headers["X-Lyceum-Session"] == events[0]["chat_id"]
    assert text == events[-1]["text"] and "84" in text
    assert "thinking_delta" in kinds
    start = next(e for e in events if e["type"] == "tool_start")
    end = next(e for e in events if e["type"] == "tool_end")
    assert (start["name"], start["input"]) == ("calculator", {"expression": "12*7"})
    assert (end["name"], end["status"], end["call_id"]) == ("calculator", "done", start["call_id"])
    assert "84" in end["output"]
    assert kinds.index("tool_start") < kinds.index("tool_end") < len(kinds) - 1
    # The final text matches what the chat stored.
    stored = Run.objects.get(pk=events[-1]["run_id"])
    assert stored.status == Run.Status.COMPLETED and stored.output_tokens > 0


def test_a_long_stream_arrives_in_many_deltas_that_spell_the_reply(alice, alice_key, live):
    _response, events = stream(live, alice_key, {"message": "hello there", "thinking": False})

    text = check_stream(events)
    assert text == events[-1]["text"] and "hello there" in text
    assert "thinking_delta" not in [e["type"] for e in events]
    assert [e["type"] for e in events].count("delta") > 1
    assert Run.objects.get(pk=events[-1]["run_id"]).thinking is False


def test_the_stream_stays_open_through_an_approval_given_on_another_connection(
    alice, alice_key, live
):
    events: list[dict[str, Any]] = []
    decisions: list[httpx.Response] = []
    with httpx.Client(base_url=live, timeout=30, headers=auth(alice_key)) as client:
        body = {"message": "write file notes.md then read it"}
        with client.stream("POST", "/api/v1/chat/stream", json=body) as response:
            assert response.status_code == 200
            for event in data_lines(response):
                events.append(event)
                if event["type"] == "approval_required":
                    url = f"/api/v1/chat/{event['chat_id']}/approvals/{event['call_id']}"
                    # From a second connection while this one stays open.
                    with httpx.Client(base_url=live, timeout=30) as other:
                        decisions.append(
                            other.post(
                                url,
                                json={"decision": "approve", "always": True},
                                headers=auth(alice_key),
                            )
                        )
    text = check_stream(events)
    kinds = [e["type"] for e in events]
    assert [d.status_code for d in decisions] == [200]
    assert decisions[0].json()["status"] == "approved"
    assert kinds.index("approval_required") < kinds.index("approval_decided")
    ran = [(e["name"], e["status"]) for e in events if e["type"] == "tool_end"]
    assert ("write_file", "done") in ran and ("read_file", "done") in ran
    assert kinds[-1] == "complete" and text == events[-1]["text"]


def test_cancel_from_another_connection_ends_the_stream_with_the_partial_text(
    alice, alice_key, live
):
    events: list[dict[str, Any]] = []
    cancels: list[dict[str, Any]] = []
    with httpx.Client(base_url=live, timeout=30, headers=auth(alice_key)) as client:
        body = {"message": "give me a long answer", "thinking": False}
        with client.stream("POST", "/api/v1/chat/stream", json=body) as response:
            for event in data_lines(response):
                events.append(event)
                if event["type"] == "delta" and not cancels:
                    with httpx.Client(base_url=live, timeout=30) as other:
                        url = f"/api/v1/chat/{event['chat_id']}/cancel"
                        cancels.append(other.post(url, headers=auth(alice_key)).json())
        again = client.post(f"/api/v1/chat/{events[0]['chat_id']}/cancel")
    text = check_stream(events)
    assert cancels == [
        {"session_id": events[0]["chat_id"], "run_id": events[0]["run_id"], "cancelled": True}
    ]
    assert again.json()["cancelled"] is False  # nothing live any more: idempotent
    assert events[-1]["type"] == "cancelled"
    assert text and text == events[-1]["partial_text"]
    run = Run.objects.get(pk=events[-1]["run_id"])
    assert run.status == Run.Status.CANCELLED and run.partial_text == text


def test_a_message_sent_while_a_run_is_live_is_streamed_by_the_run_that_takes_it(
    alice, alice_key, live
):
    """The second message is queued behind a live run; its stream follows the next run."""
    first: list[dict[str, Any]] = []
    second: dict[str, Any] = {}
    with httpx.Client(base_url=live, timeout=30, headers=auth(alice_key)) as client:
        body = {"message": "give me a long answer", "thinking": False}
        with client.stream("POST", "/api/v1/chat/stream", json=body) as response:
            for event in data_lines(response):
                first.append(event)
                if event["type"] != "delta" or second:
                    continue
                chat_id = event["chat_id"]
                queued = {"message": "a queued question", "session_id": chat_id}

                def follow(body: dict[str, Any] = queued) -> None:
                    second["events"] = stream(live, alice_key, body)[1]

                reader = threading.Thread(target=follow)
                second["reader"] = reader
                reader.start()
                while QueuedInput.objects.filter(chat_id=chat_id).count() < 2:
                    reader.join(0.02)  # until the queued message is stored
                    assert reader.is_alive()
                client.post(f"/api/v1/chat/{chat_id}/cancel")
        second["reader"].join(30)
    assert first[-1]["type"] == "cancelled"
    events = second["events"]
    text = check_stream(events)
    assert events[0]["type"] == "input_taken" and events[-1]["type"] == "complete"
    assert events[0]["run_id"] != first[0]["run_id"]
    assert text == events[-1]["text"] and "a queued question" in text


# --- error envelopes ---------------------------------------------------------------------------


def assert_error(response, status: int, type_: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    error = json.loads(response.content)["error"]
    assert error["type"] == type_ and error["message"]
    return error


@pytest.fixture
def api_client() -> AsyncClient:
    return AsyncClient()


async def test_no_key_a_bad_key_and_a_malformed_header_are_401(api_client, alice_key, make_user):
    inactive = await database_sync_to_async(make_user)("carol")
    _key, inactive_key = await database_sync_to_async(create_api_key)(inactive)
    inactive.is_active = False
    await inactive.asave()
    for headers in (
        {},
        auth("lyk_not-a-real-key"),
        auth(""),
        {"Authorization": alice_key},  # no scheme
        {"Authorization": f"Basic {alice_key}"},
        auth(inactive_key),
    ):
        response = await api_client.post(
            "/api/v1/chat", {"message": "hi"}, content_type="application/json", headers=headers
        )
        assert_error(response, 401, "authentication_error")
        assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("body", "message_part"),
    [
        (b"{not json", "JSON"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "'message'"),
        (b'{"message": "   "}', "'message'"),
        (b'{"message": 42}', "'message'"),
        (b'{"message": "hi", "thinking": "no"}', "'thinking'"),
        (b'{"message": "hi", "session_id": 7}', "'session_id'"),
        (b'{"message": "hi", "model": ["demo"]}', "'model'"),
        (b'{"message": "hi", "model": "gpt-nope"}', "gpt-nope"),
        (b'{"message": "hi", "agent": {"slug": "x"}}', "'agent'"),
    ],
)
async def test_bad_requests_are_400_with_a_message(
    api_client, alice_key, default_agent, body, message_part
):
    for url in ("/api/v1/chat", "/api/v1/chat/stream"):
        response = await api_client.post(
            url, body, content_type="application/json", headers=auth(alice_key)
        )
        error = assert_error(response, 400, "invalid_request_error")
        assert message_part in error["message"]
    assert not await Run.objects.aexists()  # refused before anything started


async def test_an_unknown_agent_is_404(api_client, alice_key, default_agent):
    for url in ("/api/v1/chat", "/api/v1/chat/stream"):
        response = await api_client.post(
            url,
            {"message": "hi", "agent": "no-such-agent"},
            content_type="application/json",
            headers=auth(alice_key),
        )
        assert "no-such-agent" in assert_error(response, 404, "not_found")["message"]


async def test_wrong_methods_are_405(api_client, alice_key):
    session = uuid.uuid4()
    for url in (
        "/api/v1/chat",
        "/api/v1/chat/stream",
        f"/api/v1/chat/{session}/cancel",
        f"/api/v1/chat/{session}/approvals/call_1",
    ):
        for method in (api_client.get, api_client.put, api_client.delete):
            response = await method(url, headers=auth(alice_key))
            assert_error(response, 405, "method_not_allowed")
            assert response["Allow"] == "POST"


async def test_bodies_over_the_limit_are_413(api_client, alice_key):
    for size in (300 * 1024, 3 * 1024 * 1024):  # over the API's limit / over Django's
        body = json.dumps({"message": "x" * size}).encode()
        for url in ("/api/v1/chat", "/api/v1/chat/stream"):
            response = await api_client.post(
                url, body, content_type="application/json", headers=auth(alice_key)
            )
            assert_error(response, 413, "invalid_request_error")


async def test_another_users_session_is_404_everywhere(api_client, alice, bob_key, default_agent):
    chat = await database_sync_to_async(actions.new_chat)(alice)
    sent = await database_sync_to_async(actions.send_message)(
        alice, chat.pk, "write file a.md", "c1"
    )
    approval = await database_sync_to_async(ToolApproval.objects.create)(
        chat=chat,
        run_id=sent.run_id,
        call_id="call_1",
        tool_name="write_file",
        arguments="{}",
        expires_at=timezone.now(),
    )
    headers = auth(bob_key)
    requests = [
        ("/api/v1/chat", {"message": "hi", "session_id": str(chat.pk)}),
        ("/api/v1/chat/stream", {"message": "hi", "session_id": str(chat.pk)}),
        (f"/api/v1/chat/{chat.pk}/cancel", {}),
        (f"/api/v1/chat/{chat.pk}/approvals/{approval.call_id}", {"decision": "approve"}),
    ]
    for url, body in requests:
        response = await api_client.post(
            url, body, content_type="application/json", headers=headers
        )
        assert_error(response, 404, "not_found")
    response = await api_client.get(f"/api/v1/chat/{chat.pk}/runs/{sent.run_id}", headers=headers)
    assert_error(response, 404, "not_found")
    for malformed in ("not-a-uuid", "1"):  # still JSON, still 404
        response = await api_client.post(
            f"/api/v1/chat/{malformed}/cancel", {}, content_type="application/json", headers=headers
        )
        assert_error(response, 404, "not_found")
    unknown = {"message": "hi", "session_id": str(uuid.uuid4())}
    response = await api_client.post(
        "/api/v1/chat", unknown, content_type="application/json", headers=headers
    )
    assert_error(response, 404, "not_found")
    run = await database_sync_to_async(Run.objects.get)(pk=sent.run_id)
    assert not run.cancel_requested and run.status == Run.Status.RUNNING
    approval = await database_sync_to_async(ToolApproval.objects.get)(pk=approval.pk)
    assert approval.status == ToolApproval.Status.PENDING
    count = await database_sync_to_async(QueuedInput.objects.filter(chat=chat).count)()
    assert count == 1  # bob's messages went nowhere


async def test_approval_answers_are_checked(api_client, alice, alice_key, default_agent):
    chat = await database_sync_to_async(actions.new_chat)(alice)
    url = f"/api/v1/chat/{chat.pk}/approvals/call_missing"
    for body, status in (
        ({"decision": "maybe"}, 400),
        ({"decision": "approve", "reason": 5}, 400),
        ({"decision": "approve", "always": "yes"}, 400),
        ({"decision": "approve"}, 404),
    ):
        response = await api_client.post(
            url, body, content_type="application/json", headers=auth(alice_key)
        )
        assert_error(response, status, "invalid_request_error" if status == 400 else "not_found")


def test_errors_over_real_http_are_json(alice_key, live):
    with httpx.Client(base_url=live, timeout=30) as client:
        cases = [
            (client.post("/api/v1/chat", json={"message": "hi"}), 401),
            (client.post("/api/v1/chat", content=b"{oops", headers=auth(alice_key)), 400),
            (client.get("/api/v1/chat/stream", headers=auth(alice_key)), 405),
            (
                client.post(
                    "/api/v1/chat", content=b"x" * (3 * 1024 * 1024), headers=auth(alice_key)
                ),
                413,
            ),
            (client.post(f"/api/v1/chat/{uuid.uuid4()}/cancel", headers=auth(alice_key)), 404),
        ]
    for response, status in cases:
        assert response.status_code == status, (status, response.text[:200])
        assert response.json()["error"]["message"]

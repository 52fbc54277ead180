"""Upstream faults end the client's stream with an OpenAI-shaped error and a failed record;
the key pool fails over before the first byte; a client that leaves still leaves a record."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from chat.models import ChatEvent, ProviderKey, RelaySession
from tests.fakeopenai import Script
from tests.relay.conftest import UPSTREAM_KEYS, wait_for_records

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "hi"}]


def _stream_error(relay) -> openai.APIError:
    client = relay.client()
    with pytest.raises(openai.APIError) as caught:
        for _chunk in client.chat.completions.create(
            model="gpt-relay", messages=MESSAGES, stream=True
        ):
            pass
    return caught.value


@pytest.mark.parametrize(
    ("script", "code"),
    [
        (Script(n_tokens=5, fault_after=2, malformed=True), "upstream_malformed"),
        (Script(n_tokens=5, fault_after=2, drop=True), None),
        (Script(n_tokens=5, fault_after=2, stall=3.0), "upstream_timeout"),
    ],
    ids=["malformed", "dropped", "stall"],
)
def test_mid_stream_faults_end_with_an_error_event(relay, script, code):
    relay.upstream.enqueue(script)
    error = _stream_error(relay)
    if code:
        assert error.body["code"] == code  # type: ignore[index]
    (record,) = wait_for_records(1)
    assert record.status == "failed" and record.error
    assert record.estimated is True  # no usage came: an estimate, marked


def test_dropped_stream_error_is_openai_shaped(relay):
    relay.upstream.enqueue(Script(n_tokens=5, fault_after=2, drop=True))
    with httpx.stream(
        "POST",
        f"{relay.url}/chat/completions",
        json={"model": "gpt-relay", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {relay.key}"},
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    last = json.loads(lines[-1][6:])
    assert set(last["error"]) == {"message", "type", "code"}
    assert last["error"]["code"] in {"upstream_incomplete", "upstream_disconnected"}


def test_an_error_the_upstream_streams_is_passed_on(relay):
    relay.upstream.enqueue(
        Script(n_tokens=5, fault_after=1, stream_error={"error": {"message": "overloaded"}})
    )
    error = _stream_error(relay)
    assert "overloaded" in str(error)
    (record,) = wait_for_records(1)
    assert record.status == "failed"


@pytest.mark.parametrize("status", [500, 429, 401])
def test_a_failing_key_before_the_first_byte_is_retried_on_another(relay, status):
    relay.upstream.enqueue(
        Script(status=status, error_body={"error": {"message": "no"}}), Script(text="ok then")
    )
    reply = relay.client().chat.completions.create(model="gpt-relay", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok then"
    keys = [r.headers["authorization"] for r in relay.upstream.chat_requests()]
    assert len(keys) == 2 and keys[0] != keys[1]
    (record,) = wait_for_records(1)
    assert record.status == "ok"
    first = ProviderKey.objects.get(secret__isnull=False, pk=_key_pk(keys[0]))
    assert (first.failures, first.last_status) == (1, status)
    assert (first.cooldown_until is not None) == (status in (429, 401))


def _key_pk(header: str) -> int:
    from chat.relay import secrets

    for key in ProviderKey.objects.all():
        if f"Bearer {secrets.decrypt(key.secret)}" == header:
            return key.pk
    raise AssertionError("unknown key")


def test_all_keys_failing_gives_the_sdk_error_and_a_failed_record(relay):
    relay.upstream.enqueue(Script(status=500), Script(status=500))
    with pytest.raises(openai.InternalServerError) as caught:
        relay.client().chat.completions.create(model="gpt-relay", messages=MESSAGES)
    assert caught.value.status_code == 502
    relay.upstream.enqueue(Script(status=429), Script(status=429))
    with pytest.raises(openai.RateLimitError):
        relay.client().chat.completions.create(model="gpt-relay", messages=MESSAGES, stream=True)
    records = wait_for_records(2)
    assert [r.status for r in records] == ["failed", "failed"]
    assert [r.http_status for r in records] == [502, 429]
    # Both keys now cool down: the relay does not hammer the upstream.
    with pytest.raises(openai.RateLimitError) as cooling:
        relay.client().chat.completions.create(model="gpt-relay", messages=MESSAGES)
    assert cooling.value.body["code"] == "upstream_rate_limited"  # type: ignore[index]
    assert len(relay.upstream.chat_requests()) == 4


def test_client_disconnect_closes_upstream_and_leaves_a_record(relay):
    relay.upstream.enqueue(Script(n_tokens=200, token_delay=0.02))
    with httpx.stream(
        "POST",
        f"{relay.url}/chat/completions",
        json={"model": "gpt-relay", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {relay.key}"},
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
    assert relay.upstream.wait_for_disconnect(1, timeout=5)
    (record,) = wait_for_records(1)
    assert record.status == "cancelled" and record.estimated is True


def test_session_key_stores_the_exchange_in_a_chat(relay):
    relay.upstream.enqueue(Script(text="First reply."), Script(text="Second reply."))
    client = relay.client()
    list(
        client.chat.completions.create(
            model="gpt-relay",
            messages=MESSAGES,
            stream=True,
            extra_body={"session_key": "nightly-job"},
        )
    )
    client.chat.completions.create(
        model="gpt-relay",
        messages=[{"role": "user", "content": "and again"}],
        extra_body={"session_key": "nightly-job"},
    )
    wait_for_records(2)
    sent = relay.upstream.chat_requests()[0].json
    assert "session_key" not in sent
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        link = RelaySession.objects.filter(user=relay.user, session_key="nightly-job").first()
        if link and ChatEvent.objects.filter(chat=link.chat, channel="display").count() >= 4:
            break
        time.sleep(0.05)
    assert link is not None and link.chat.title == "nightly-job" and link.chat.owner == relay.user
    display = [
        (e.payload["role"], e.payload["content"])
        for e in ChatEvent.objects.filter(chat=link.chat, channel="display").order_by("seq")
    ]
    assert display == [
        ("user", "hi"),
        ("assistant", "First reply."),
        ("user", "and again"),
        ("assistant", "Second reply."),
    ]
    assert ChatEvent.objects.filter(chat=link.chat, channel="session").count() == 4
    records = wait_for_records(2)
    assert {r.session_key for r in records} == {"nightly-job"}


def test_agent_id_applies_its_prompt_and_default_model(relay):
    from chat.models import Agent

    Agent.objects.create(
        name="Owl", slug="owl", system_prompt="You are an owl.", default_model="gpt-relay"
    )
    relay.upstream.enqueue(Script(text="Hoo."))
    response = httpx.post(
        f"{relay.url}/chat/completions",
        json={"messages": MESSAGES, "agent_id": "owl"},
        headers={"Authorization": f"Bearer {relay.key}"},
    )
    assert response.status_code == 200, response.text
    sent = relay.upstream.chat_requests()[-1].json
    assert sent["messages"][0] == {"role": "system", "content": "You are an owl."}
    assert sent["model"] == "fake-model" and "agent_id" not in sent
    (record,) = wait_for_records(1)
    assert record.agent_id == "owl"
    with pytest.raises(openai.NotFoundError):
        relay.client().chat.completions.create(
            model="gpt-relay", messages=MESSAGES, extra_body={"agent_id": "nobody"}
        )


def test_keys_stay_out_of_logs_and_the_admin(relay, client, make_user):
    admin = make_user("root", staff=True)
    admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    for url in ("/admin/chat/provider/", f"/admin/chat/provider/{relay.provider.pk}/change/"):
        page = client.get(url).content.decode()
        for raw in UPSTREAM_KEYS:
            assert raw not in page and raw[:12] not in page

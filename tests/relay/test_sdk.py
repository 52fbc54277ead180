"""The OpenAI Python SDK as a real client of the relay (live Daphne, loopback fake upstream)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from chat.models import ProviderKey
from tests.fakeopenai import FakeToolCall, Script
from tests.relay.conftest import UPSTREAM_KEYS, wait_for_records

pytestmark = pytest.mark.django_db(transaction=True)


def test_streaming_reply_with_usage(relay):
    relay.upstream.enqueue(Script(text="Hello there, friend.", prompt_tokens=17))
    stream = relay.client().chat.completions.create(
        model="gpt-relay",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there, friend."
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 17
    sent = relay.upstream.chat_requests()[-1].json
    assert sent["model"] == "fake-model"  # the alias never reaches the upstream
    assert sent["stream_options"] == {"include_usage": True}
    (record,) = wait_for_records(1)
    assert (record.status, record.stream, record.estimated) == ("ok", True, False)
    assert (record.prompt_tokens, record.completion_tokens) == (17, 3)
    assert record.model == "gpt-relay" and record.user == relay.user
    assert record.ttft_ms is not None and record.latency_ms is not None


def test_usage_is_asked_for_even_when_the_client_does_not(relay):
    relay.upstream.enqueue(Script(text="a b c"))
    list(
        relay.client().chat.completions.create(
            model="gpt-relay", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert relay.upstream.chat_requests()[-1].json["stream_options"]["include_usage"] is True
    (record,) = wait_for_records(1)
    assert record.estimated is False and record.completion_tokens == 3


def test_stream_without_usage_records_an_estimate(relay):
    relay.upstream.enqueue(Script(text="one two three four", usage=False))
    list(
        relay.client().chat.completions.create(
            model="gpt-relay", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    (record,) = wait_for_records(1)
    assert record.estimated is True and record.status == "ok"
    assert record.completion_tokens > 0 and record.prompt_tokens > 0


def test_non_streaming_reply_and_model_by_id(relay):
    relay.upstream.enqueue(Script(text="Plain answer.", prompt_tokens=9))
    reply = relay.client().chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], n=1
    )
    assert reply.choices[0].message.content == "Plain answer."
    assert reply.usage is not None and reply.usage.prompt_tokens == 9
    (record,) = wait_for_records(1)
    assert (record.status, record.stream, record.prompt_tokens) == ("ok", False, 9)


def test_tools_pass_through_both_ways(relay):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look something up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    relay.upstream.enqueue(
        Script(text="", tool_calls=[FakeToolCall("lookup", '{"q": "owls"}')]),
        Script(text="", tool_calls=[FakeToolCall("lookup", '{"q": "owls"}')]),
    )
    client = relay.client()
    reply = client.chat.completions.create(
        model="gpt-relay", messages=[{"role": "user", "content": "find owls"}], tools=tools
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "owls"}
    assert relay.upstream.chat_requests()[-1].json["tools"] == tools
    chunks = list(
        client.chat.completions.create(
            model="gpt-relay",
            messages=[{"role": "user", "content": "find owls"}],
            tools=tools,
            stream=True,
        )
    )
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert json.loads(arguments) == {"q": "owls"}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"


def test_models_lists_the_whitelist(relay):
    models = relay.client().models.list()
    ids = [m.id for m in models.data]
    assert ids == ["gpt-relay"]  # the offline demo models are not relayed
    data = models.data[0].model_dump()
    assert data["owned_by"] == "up" and data["context_window"] == 32000
    assert data["max_output_tokens"] == 4096 and data["supports_streaming"] is True


def test_errors_become_the_sdks_exceptions(relay):
    bad = relay.client(api_key="lyk_not-a-key")
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="gpt-relay", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"
    client = relay.client()
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert not_found.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-relay", messages=[{"role": "pirate"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-relay", messages=[])
    response = httpx.post(
        f"{relay.url}/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {relay.key}"},
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "code"}


def test_rate_limit_is_a_rate_limit_error_with_retry_after(relay):
    from chat.models import RelayLimit

    RelayLimit.objects.create(user=relay.user, requests_per_minute=1, burst=2)
    client = relay.client()
    for _ in range(2):
        client.chat.completions.create(
            model="gpt-relay", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="gpt-relay", messages=[{"role": "user", "content": "x"}]
        )
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    assert caught.value.body["code"] == "rate_limit_exceeded"


def test_provider_keys_never_leave_the_server(relay):
    relay.upstream.enqueue(
        Script(status=400, error_body={"error": {"message": f"bad key {UPSTREAM_KEYS[0]} sent"}}),
        Script(status=400, error_body={"error": {"message": f"bad key {UPSTREAM_KEYS[1]} sent"}}),
    )
    client = relay.client()
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="gpt-relay", messages=[{"role": "user", "content": "x"}]
            )
        text = json.dumps(caught.value.body)
        assert "sk-upstream" not in text and "0123456789abcdef" not in text
    used = {r.headers["authorization"] for r in relay.upstream.chat_requests()}
    assert used == {f"Bearer {k}" for k in UPSTREAM_KEYS}  # spread over the pool
    for key in ProviderKey.objects.all():
        assert key.secret.startswith("enc:") and "sk-upstream" not in key.secret

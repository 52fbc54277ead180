"""One Lyceum can use another Lyceum's relay as its provider (base URL = the relay)."""

from __future__ import annotations

import asyncio

import pytest

from chat.catalog import close_providers, resolve_model
from chat.core.messages import user as user_message
from chat.llm.types import ChatRequest, StreamEnd, TextDelta
from chat.models import Provider, ProviderModel
from chat.relay import secrets
from tests.fakeopenai import Script
from tests.relay.conftest import wait_for_records

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_provider_pointed_at_a_relay(relay):
    hop = Provider.objects.create(
        name="hop", base_url=relay.url, api_key=secrets.encrypt(relay.key)
    )
    ProviderModel.objects.create(provider=hop, alias="via-relay", model_id="gpt-relay")
    relay.upstream.enqueue(Script(text="Relayed twice over.", prompt_tokens=5))
    resolved = resolve_model("via-relay")

    async def talk() -> tuple[str, StreamEnd]:
        text, end = "", None
        async for chunk in resolved.provider.stream(
            ChatRequest(model=resolved.choice.model_id, messages=[user_message("hi")])
        ):
            if isinstance(chunk, TextDelta):
                text += chunk.text
            elif isinstance(chunk, StreamEnd):
                end = chunk
        await close_providers()
        assert end is not None
        return text, end

    text, end = asyncio.run(talk())
    assert text == "Relayed twice over."
    assert end.usage is not None and end.usage.input_tokens == 5 and not end.usage.estimated
    sent = relay.upstream.chat_requests()[-1]
    assert sent.json["model"] == "fake-model"
    assert sent.headers["authorization"] != f"Bearer {relay.key}"  # the relay's own key went on
    (record,) = wait_for_records(1)
    assert record.status == "ok" and record.prompt_tokens == 5
